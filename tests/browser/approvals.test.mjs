// Approval cards in the WebChat (issues 38 and 37): the fake provider asks for `bash` (its `[approve]`
// marker), which waits under the default `ask` policy; the page shows an approval card (tool,
// command, working directory, reason; Allow once / Always / Deny), announced live and also
// rebuilt from exec.approval.list after a reload. "Allow once" runs the command exactly once and
// the turn ends with the model's reply; "Deny" gives the call a denied result and the command
// does not run.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { REPO, TOKEN, launchBrowser, readTranscript, recordFrames, startFakeProvider, startGateway, textOf, waitFor } from "./harness.mjs";

describe("WebChat: approval cards", () => {
  let provider, gw, browser, page, frames;
  const errors = [];
  const ws = () => path.join(gw.stateDir, "workspace/main");
  const runs = () => { try { return fs.readFileSync(path.join(ws(), "approved.log"), "utf8").split("\n").filter(Boolean).length; } catch { return 0; } };

  before(async () => {
    provider = await startFakeProvider();
    gw = await startGateway(provider);
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

  const card = () => page.locator('[data-testid="approval"]');
  const toolResults = () => readTranscript(gw.stateDir).map((r) => r.message).filter((m) => m?.role === "toolResult");

  async function shown() {
    const c = card();
    assert.equal(await c.count(), 1, "one card for the one waiting call");
    const t = (id) => c.locator(`[data-testid="${id}"]`).innerText();
    return { tool: await t("approval-tool"), command: await t("approval-command"), cwd: await t("approval-cwd"), reason: await t("approval-reason") };
  }

  test("Allow once: the card shows the request, survives a reload, and the command runs once", async () => {
    await page.locator('[data-testid="composer"]').fill("run it [approve]");
    await page.locator('[data-testid="send"]').click();
    await card().waitFor({ timeout: 20000 });
    const live = await shown();
    assert.equal(live.tool, "bash");
    assert.equal(live.command, "echo approved >> approved.log");
    assert.equal(live.cwd, ws());
    assert.match(live.reason, /needs approval/);
    for (const b of ["approve-once", "approve-always", "approve-deny"]) assert.equal(await card().locator(`[data-testid="${b}"]`).count(), 1, b);
    const requested = frames.map((f) => f.frame).find((f) => f.event === "exec.approval.requested");
    assert.ok(requested, "the page heard OpenClaw's exec.approval.requested");
    assert.equal(runs(), 0, "nothing ran while it waits");
    const shot = path.join(REPO, "target/approval-card.png");
    await card().screenshot({ path: shot });
    console.log(`# screenshot: ${shot}`);

    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor();
    await card().waitFor();
    assert.deepEqual(await shown(), live, "rebuilt from exec.approval.list");

    await card().locator('[data-testid="approve-once"]').click();
    await waitFor("the model's reply after the command ran", async () => readTranscript(gw.stateDir).some((r) => r.message?.role === "assistant" && r.message?.stopReason === "stop"));
    await waitFor("the card gone", async () => (await card().count()) === 0);
    assert.equal(runs(), 1, "the command ran exactly once");
    const [result] = toolResults();
    assert.equal(result.isError, false, textOf(result));
  });

  test("Deny: a denied result, and the command does not run", async () => {
    await page.locator('[data-testid="composer"]').fill("again [approve]");
    await page.locator('[data-testid="send"]').click();
    await card().waitFor({ timeout: 20000 });
    await card().locator('[data-testid="approve-deny"]').click();
    await waitFor("the denied result", async () => toolResults().length === 2);
    const denied = toolResults()[1];
    assert.equal(denied.isError, true);
    assert.match(textOf(denied), /^Denied by webchat-ui/);
    await waitFor("the card gone", async () => (await card().count()) === 0);
    assert.equal(runs(), 1, "not run again");
    assert.deepEqual(errors, []);
  });
});
