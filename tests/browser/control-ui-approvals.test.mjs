// OpenClaw's own Control UI (the unmodified pinned dist/control-ui) approving against the real
// `pincer gateway` (issue 38): the fake provider asks for `bash` (its `[approve]` marker), the call
// waits under the default `ask` policy, the UI shows OpenClaw's exec approval prompt from
// Pincer's exec.approval.requested (and its exec.approval.list backfill), and its "Allow once"
// sends exec.approval.resolve: the command runs once and the run ends `final`.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { REPO, TOKEN, launchBrowser, readTranscript, recordFrames, startFakeProvider, startGateway, waitFor, controlUiDir } from "./harness.mjs";

const UI_DIR = controlUiDir();
const SLOW = 45000; // the UI needs several seconds to settle

describe("OpenClaw Control UI: exec approvals against Pincer", () => {
  let provider, gw, browser, page, frames;
  before(async () => {
    provider = await startFakeProvider();
    gw = await startGateway(provider, `[gateway]\ncontrol_ui_dir = ${JSON.stringify(UI_DIR)}\n`);
    browser = await launchBrowser();
    page = await browser.context.newPage();
    await page.setViewportSize({ width: 1280, height: 900 });
    frames = recordFrames(page);
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  test("Allow once in the Control UI runs the waiting bash call once", async () => {
    const runs = () => { try { return fs.readFileSync(path.join(gw.stateDir, "workspace/main/approved.log"), "utf8").split("\n").filter(Boolean).length; } catch { return 0; } };
    await page.goto(`${gw.url}/control/#token=${TOKEN}`);
    const composer = page.locator('textarea[aria-label="Chat composer"]');
    await composer.waitFor({ state: "visible", timeout: SLOW });
    await composer.fill("run it [approve]");
    await composer.press("Enter");
    await waitFor("exec.approval.requested", () => frames.some((f) => f.dir === "in" && f.frame.event === "exec.approval.requested"), SLOW);
    const allow = page.getByRole("button", { name: "Allow once" }).first();
    try {
      await allow.waitFor({ state: "visible", timeout: SLOW });
    } catch (e) {
      await page.screenshot({ path: path.join(REPO, "target/control-ui-approval-missing.png") });
      throw e;
    }
    await page.screenshot({ path: path.join(REPO, "target/control-ui-approval.png") });
    assert.equal(runs(), 0, "nothing ran while it waits");
    await allow.click();
    const resolve = () => frames.find((f) => f.dir === "out" && f.frame.method === "exec.approval.resolve");
    await waitFor("the UI's exec.approval.resolve", resolve, SLOW);
    assert.equal(resolve().frame.params.decision, "allow-once");
    await waitFor("the run's final", () => frames.some((f) => f.dir === "in" && f.frame.event === "chat" && f.frame.payload.state === "final"), SLOW);
    assert.equal(runs(), 1, "the command ran exactly once");
    const result = readTranscript(gw.stateDir).map((r) => r.message).find((m) => m?.role === "toolResult");
    assert.equal(result.isError, false);
    const scopes = frames.find((f) => f.dir === "in" && f.frame.type === "res" && f.frame.payload?.type === "hello-ok")?.frame.payload.auth?.scopes;
    console.log(`# hello-ok scopes: ${JSON.stringify(scopes)}`);
  });
});
