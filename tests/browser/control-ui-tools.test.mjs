// OpenClaw's own Control UI (the unmodified pinned dist/control-ui) against the real `pincer
// gateway`, for tool calls: the fake provider asks for the `ls` tool (its `[tool]` marker), and the
// UI shows the tool card it draws from the `agent` tool stream and chat.history, finished, not running.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { REPO, TOKEN, launchBrowser, readTranscript, recordFrames, startFakeProvider, startGateway, waitFor, controlUiDir } from "./harness.mjs";

const UI_DIR = controlUiDir();
const SLOW = 45000; // the UI needs several seconds to settle

describe("OpenClaw Control UI: tool cards against Pincer", () => {
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

  test("the ls call shows as a finished tool card", async () => {
    await page.goto(`${gw.url}/control/#token=${TOKEN}`);
    const composer = page.locator('textarea[aria-label="Chat composer"]');
    await composer.waitFor({ state: "visible", timeout: SLOW });
    await composer.fill("list the files [tool]");
    await composer.press("Enter");
    await waitFor("the run's final", () => frames.some((f) => f.dir === "in" && f.frame.event === "chat" && f.frame.payload.state === "final"), SLOW);
    const tools = frames.filter((f) => f.dir === "in" && f.frame.event === "agent" && f.frame.payload.stream === "tool");
    assert.deepEqual(tools.map((f) => f.frame.payload.data.phase), ["start", "result"]);
    const row = page.locator("button.chat-tool-row", { hasText: "Ls" });
    await row.waitFor({ timeout: SLOW });
    await row.click();
    const card = page.locator(".chat-tool-card").first();
    await card.waitFor({ timeout: SLOW });
    const onDisk = readTranscript(gw.stateDir).map((r) => r.message).find((m) => m?.role === "toolResult");
    const blocks = await card.locator(".chat-tool-card__block-content").allInnerTexts();
    assert.deepEqual(blocks.map((b) => b.trim()), ["{}", onDisk.content[0].text], "the call's input and the result on disk");
    assert.equal((await card.locator(".chat-tool-card__outcome").innerText()).trim(), "Completed");
    assert.equal(await page.locator(".chat-tool-card--error, .chat-tool-row--running").count(), 0, "neither failed nor running");
    await page.screenshot({ path: path.join(REPO, "target/control-ui-tool.png") });
  });
});
