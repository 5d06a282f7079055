// Streamed tool output in the WebChat (issue 37, "The agent acts"): the fake provider asks for
// `bash` printing line-1 … line-5 over two seconds (its `[bash]` marker); the real gateway runs it in
// its sandbox and announces the output so far with OpenClaw's `agent` tool events (phase `update`).
// While the call runs, its card (data-status="running") shows that output, growing; once the
// toolResult row is on disk, the result (the one on disk) replaces it. Screenshots of the card,
// running and done, go to target/tool-stream-running.png and target/tool-stream-done.png.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { REPO, TOKEN, launchBrowser, readTranscript, recordFrames, startFakeProvider, startGateway, textOf, waitFor } from "./harness.mjs";

describe("WebChat: a running tool's output", () => {
  let provider, gw, browser, page, frames;
  const errors = [];

  before(async () => {
    provider = await startFakeProvider();
    gw = await startGateway(provider, '[agents.defaults.tools]\napproval = "allow"');
    browser = await launchBrowser();
    page = await browser.context.newPage();
    await page.setViewportSize({ width: 1100, height: 760 });
    frames = recordFrames(page);
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(`${gw.url}/#token=${TOKEN}`);
    await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  const card = () => page.locator('[data-testid="tool-call"][data-tool="bash"]');

  test("the card shows the output while the call runs, then the result", async () => {
    await page.locator('[data-testid="composer"]').fill("count for me [bash]");
    await page.locator('[data-testid="send"]').click();
    const running = page.locator('[data-testid="tool-call"][data-tool="bash"][data-status="running"]');
    await running.locator('[data-testid="tool-output"]', { hasText: "line-1" }).waitFor({ timeout: 20000 });
    const seen = [await running.locator('[data-testid="tool-output"]').innerText()];
    assert.equal(await running.locator('[data-testid="tool-result"]').count(), 0, "no result while running");
    await running.locator('[data-testid="tool-output"]', { hasText: "line-2" }).waitFor();
    seen.push(await running.locator('[data-testid="tool-output"]').innerText().catch(() => "(done by now)"));
    const shotRunning = path.join(REPO, "target/tool-stream-running.png");
    await running.screenshot({ path: shotRunning }).catch((e) => console.log(`# no running screenshot: ${e.message}`));
    console.log(`# output seen while running: ${JSON.stringify(seen)}; screenshot: ${shotRunning}`);

    await waitFor("the bash card with status ok", async () => (await card().getAttribute("data-status").catch(() => null)) === "ok");
    const onDisk = readTranscript(gw.stateDir).map((r) => r.message).find((m) => m?.role === "toolResult");
    assert.ok(onDisk, "the toolResult row is on disk");
    const done = card();
    if (!(await done.evaluate((d) => d.open))) await done.locator("summary").click();
    assert.equal(await done.locator('[data-testid="tool-result"]').innerText(), textOf(onDisk));
    assert.match(textOf(onDisk), /^line-1\nline-2\nline-3\nline-4\nline-5/);
    assert.equal(await done.locator('[data-testid="tool-output"]').count(), 0, "the result replaced the output");
    const shotDone = path.join(REPO, "target/tool-stream-done.png");
    await done.screenshot({ path: shotDone });
    console.log(`# screenshot: ${shotDone}`);

    const phases = frames.map((f) => f.frame).filter((f) => f.event === "agent" && f.payload?.stream === "tool").map((f) => f.payload.data.phase);
    console.log(`# tool stream: ${phases.join(" ")}`);
    assert.equal(phases[0], "start");
    assert.equal(phases.at(-1), "result");
    assert.ok(phases.filter((p) => p === "update").length >= 2, `updates between: ${phases}`);
    assert.deepEqual(errors, []);
  });
});
