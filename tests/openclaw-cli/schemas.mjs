// Validates values against OpenClaw 2026.9.6's own protocol schemas (TypeBox, from its dist/):
// reads {"checks": [{"name": "<X>Schema", "value": …, "what": …}]} on stdin and prints
// {"results": [{"what", "name", "found", "errors": [...]}]}. Used by crates/pincer/tests/openclaw_compat_external.rs
// to check that Pincer's answers are what OpenClaw's clients expect, in OpenClaw's own words.
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { Value } from "typebox/value";

const dist = join(import.meta.dirname, "node_modules/openclaw/dist");
/** name -> [file, exported alias], from the `export { X as a, … }` lines of the bundle's chunks. */
const exported = new Map();
for (const file of readdirSync(dist).filter((f) => f.endsWith(".mjs"))) {
  const text = readFileSync(join(dist, file), "utf8");
  for (const block of text.matchAll(/^export \{([^}]*)\};?$/gm)) {
    for (const m of block[1].matchAll(/([A-Za-z0-9_]+Schema) as ([$A-Za-z0-9_]+)/g)) {
      if (!exported.has(m[1])) exported.set(m[1], [file, m[2]]);
    }
  }
}
const input = JSON.parse(readFileSync(0, "utf8"));
const results = [];
for (const { name, value, what } of input.checks) {
  const at = exported.get(name);
  if (!at) {
    results.push({ what, name, found: false, errors: [] });
    continue;
  }
  const mod = await import(pathToFileURL(join(dist, at[0])).href);
  const schema = mod[at[1]];
  const errors = Value.Check(schema, value) ? [] : [...Value.Errors(schema, value)].slice(0, 10)
    .map((e) => `${e.instancePath || "/"}: ${e.message}`);
  results.push({ what, name, found: true, errors });
}
process.stdout.write(JSON.stringify({ results }) + "\n");
