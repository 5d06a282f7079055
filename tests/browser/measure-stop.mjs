// Measures how soon OpenClaw's Control UI shows its Stop button after a message is sent to Pincer:
// five `[slow]` replies on one page (each stopped), the time from Enter to Stop visible, and the
// frames of a slow one. Not a test (node --test does not pick it up); run it by hand:
//   cd tests/browser && node measure-stop.mjs   (PINCER_BIN picks the gateway build)
import { TOKEN, launchBrowser, recordFrames, startFakeProvider, startGateway, controlUiDir, waitFor } from "./harness.mjs";
const UI_DIR = controlUiDir();
const provider = await startFakeProvider();
const gw = await startGateway(provider, `[gateway]\ncontrol_ui_dir = ${JSON.stringify(UI_DIR)}\n`);
const browser = await launchBrowser();
const page = await browser.context.newPage();
const frames = recordFrames(page);
try {
  await page.goto(`${gw.url}/control/#token=${TOKEN}`);
  const composer = page.locator('textarea[aria-label="Chat composer"]');
  await composer.waitFor({ timeout: 45000 });
  await page.waitForTimeout(4000);
  for (const said of ["first [slow]", "second [slow]", "third [slow]", "fourth [slow]", "fifth [slow]"]) {
    const t0 = Date.now();
    await composer.fill(said);
    await composer.press("Enter");
    const stop = page.locator('button[aria-label="Stop generating"]');
    await stop.waitFor({ state: "visible", timeout: 45000 });
    const tStop = Date.now();
    const runFrames = frames.filter((f) => f.t >= t0 && f.frame.event !== "tick").map((f) => `${f.t - t0} ${f.dir} ${JSON.stringify(f.frame).slice(0, 1500)}`);
    console.log(`--- ${said}: stop visible after ${tStop - t0} ms`);
    if (process.env.VERBOSE && tStop - t0 > 2500) console.log(runFrames.filter((l) => !l.includes('"state":"delta"') || l.includes("word0 ")).map((l) => l.slice(0, 600)).join("\n"));
    await stop.click();
    await stop.waitFor({ state: "hidden", timeout: 45000 });
    await page.waitForTimeout(2000);
  }
} finally {
  await browser.close(); await gw.stop(); await provider.close();
}
