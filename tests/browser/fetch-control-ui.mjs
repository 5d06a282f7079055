// Puts OpenClaw's static Control UI (the `dist/control-ui/` folder of the npm package pinned in
// package.json's `pincerControlUi`) into a folder, without installing the package and its hundreds
// of dependencies: `npm pack` fetches the tarball, its sha512 is checked against the pinned
// integrity, and only `package/dist/control-ui` is extracted. Does nothing when the folder is there.
// Usage: node tests/browser/fetch-control-ui.mjs [DEST]   (default <repo>/target/control-ui/<name>-<version>)
import { execFileSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const pin = JSON.parse(fs.readFileSync(path.join(here, "package.json"), "utf8")).pincerControlUi;
const dest = path.resolve(process.argv[2] || defaultDir());

export function defaultDir() {
  return path.resolve(here, "../../target/control-ui", pin.package.replace("@", "-").replace("/", "-"));
}

if (fs.existsSync(path.join(dest, "index.html"))) {
  console.log(`control UI already at ${dest}`);
  process.exit(0);
}
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "pincer-control-ui-"));
try {
  execFileSync("npm", ["pack", pin.package, "--pack-destination", tmp, "--loglevel=error"],
    { stdio: ["ignore", "ignore", "inherit"] });
  const tgzs = fs.readdirSync(tmp).filter((f) => f.endsWith(".tgz"));
  if (tgzs.length !== 1) throw new Error(`npm pack ${pin.package} left ${JSON.stringify(tgzs)} in ${tmp}`);
  const tgz = path.join(tmp, tgzs[0]);
  const got = "sha512-" + crypto.createHash("sha512").update(fs.readFileSync(tgz)).digest("base64");
  if (got !== pin.integrity) throw new Error(`${pin.package}: integrity ${got} is not the pinned ${pin.integrity}`);
  execFileSync("tar", ["-xzf", tgz, "-C", tmp, "package/dist/control-ui"], { stdio: "inherit" });
  fs.mkdirSync(path.dirname(dest), { recursive: true });
  fs.rmSync(dest, { recursive: true, force: true });
  fs.renameSync(path.join(tmp, "package/dist/control-ui"), dest);
  console.log(`control UI of ${pin.package} extracted to ${dest}`);
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
