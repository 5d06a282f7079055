// Tool calls in the WebChat (issues 37 and 40, "visible everywhere"): the fake provider asks for the `ls`
// tool (its `[tool]` marker), the real gateway runs it and writes the toolResult row, and the page
// shows a card for the call (name, arguments, result; collapsible) that turns to status ok from the
// `agent` tool stream, and is rebuilt the same from chat.history after a reload. The result shown is
// the one on disk.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { REPO, TOKEN, launchBrowser, readTranscript, recordFrames, startFakeProvider, startGateway, textOf, waitFor } from "./harness.mjs";

/** A WebChat page on `gw`, connected (`onPage` sees it before it loads); its errors go to `errors`. */
async function openChat(browser, gw, errors, onPage = () => {}) {
  const page = await browser.context.newPage();
  await page.setViewportSize({ width: 1100, height: 760 });
  onPage(page);
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${gw.url}/#token=${TOKEN}`);
  await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
  return page;
}

/** The card of tool `tool`'s call on `page`. */
const cardOf = (page, tool) => page.locator(`[data-testid="tool-call"][data-tool="${tool}"]`);

/** The card of tool `tool` as the page shows it, opened: status, arguments, result. */
async function shownCard(page, tool) {
  const c = cardOf(page, tool);
  assert.equal(await c.count(), 1, "one card for the one call");
  if (!(await c.evaluate((d) => d.open))) await c.locator("summary").click();
  return {
    status: await c.getAttribute("data-status"),
    args: JSON.parse(await c.locator('[data-testid="tool-args"]').innerText()),
    result: await c.locator('[data-testid="tool-result"]').innerText(),
  };
}

/** The run's end: Stop off, the list not busy (the end redraws the list: the card looked at after
 *  this is the one that stays). */
const runEnded = (page) => waitFor("the run's end", async () =>
  (await page.locator('[data-testid="stop"]').isDisabled()) && (await page.locator("#log[aria-busy]").count()) === 0);

describe("WebChat: tool call cards", () => {
  let provider, gw, browser, page, frames;
  const errors = [];

  before(async () => {
    provider = await startFakeProvider();
    gw = await startGateway(provider);
    browser = await launchBrowser();
    page = await openChat(browser, gw, errors, (p) => { frames = recordFrames(p); });
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  const card = () => cardOf(page, "ls");
  const shown = () => shownCard(page, "ls");

  test("the card follows the run live, and is the same after a reload", async () => {
    await page.locator('[data-testid="composer"]').fill("list the files [tool]");
    await page.locator('[data-testid="send"]').click();
    await waitFor("the tool card with status ok", async () => (await card().getAttribute("data-status").catch(() => null)) === "ok");
    await runEnded(page);
    const onDisk = readTranscript(gw.stateDir).map((r) => r.message).find((m) => m?.role === "toolResult");
    assert.ok(onDisk, "the toolResult row is on disk");
    const want = textOf(onDisk) || "(empty)";
    const live = await shown();
    assert.deepEqual(live, { status: "ok", args: {}, result: want });
    const events = frames.map((f) => f.frame).filter((f) => f.event === "agent" && f.payload?.stream === "tool").map((f) => f.payload.data.phase);
    assert.deepEqual(events, ["start", "result"], "the tool stream the page saw");
    assert.equal(await page.locator('.msg.tool:not([hidden])').count(), 0, "the result is in the card, not a separate bubble");
    const shot = path.join(REPO, "target/tool-card.png");
    // (Again if a redraw replaced the card while it was taken.)
    await waitFor("the card's screenshot", async () => { await card().screenshot({ path: shot, timeout: 3000 }); return true; });
    console.log(`# screenshot: ${shot}`);

    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor();
    await card().waitFor();
    assert.deepEqual(await shown(), live, "rebuilt from chat.history");
    assert.deepEqual(errors, []);
  });
});

// An MCP server's tool (issue 40): the real server-everything (tests/mcp, over stdio) offers `echo`
// as `mcp__everything__echo`; the fake provider calls it (its `[mcp]` marker). Its card is drawn
// like a built-in tool's: live from the tool stream, and the same from chat.history after a reload,
// with the server's answer as the result on disk.
describe("WebChat: an MCP tool's card", () => {
  let provider, gw, browser, page;
  const errors = [];
  const server = path.join(REPO, "tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");

  before(async () => {
    assert.ok(fs.existsSync(server), `no server-everything at ${server}: npm ci in tests/mcp (scripts/test does)`);
    provider = await startFakeProvider();
    gw = await startGateway(provider, `[mcp.servers.everything]\ncommand = "node"\nargs = [${JSON.stringify(server)}, "stdio"]\n`);
    browser = await launchBrowser();
    page = await openChat(browser, gw, errors);
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  const card = () => cardOf(page, "mcp__everything__echo");
  const shown = () => shownCard(page, "mcp__everything__echo");

  test("the call of mcp__everything__echo is a card with the server's answer, live and after a reload", async () => {
    await page.locator('[data-testid="composer"]').fill("echo through MCP [mcp]");
    await page.locator('[data-testid="send"]').click();
    await waitFor("the MCP card with status ok", async () => (await card().getAttribute("data-status").catch(() => null)) === "ok", 30000);
    await runEnded(page);
    const onDisk = readTranscript(gw.stateDir).map((r) => r.message).find((m) => m?.role === "toolResult");
    assert.equal(onDisk?.toolName, "mcp__everything__echo");
    assert.equal(onDisk.isError, false, textOf(onDisk));
    assert.match(textOf(onDisk), /hello from MCP/, "server-everything's echo answered");
    const live = await shown();
    assert.deepEqual(live, { status: "ok", args: { message: "hello from MCP" }, result: textOf(onDisk) });
    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor();
    await card().waitFor();
    assert.deepEqual(await shown(), live, "rebuilt from chat.history");
    assert.deepEqual(errors, []);
  });
});
