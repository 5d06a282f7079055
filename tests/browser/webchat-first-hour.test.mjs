// A newcomer's first hour in the WebChat (issue 36), in a real browser against the real gateway:
// 250 chats and 105 archived ones, every one reachable by scrolling the sidebar (sessions.list
// pages) and the oldest archived one restorable; the open chat shown even when no loaded page holds
// it; a 2,500-message chat scrolled up to its first message (chat.history windows) and a search hit
// in its 10th message opened; an address per chat (a new tab, Back/Forward); Esc stops a streaming
// reply; ↑ edits the last message; the shortcuts' help. Each checks the DOM and, where it
// matters, sessions.json or the transcript on disk.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { TOKEN, launchBrowser, readTranscript, recordFrames, startFakeProvider, startGateway, textOf, waitFor } from "./harness.mjs";

const index = (gw) => JSON.parse(fs.readFileSync(path.join(gw.stateDir, "agents/main/sessions/sessions.json"), "utf8"));
const pad = (n) => String(n).padStart(3, "0");

/** Runs protocol requests from inside the page (its origin, the test token): `calls` in order, each
 *  sent once the one before was answered; returns the answers. */
async function rpc(page, calls) {
  return page.evaluate(async ([token, calls]) => {
    const ws = new WebSocket(`ws://${location.host}/`);
    const out = [];
    await new Promise((resolve, reject) => {
      let i = 0;
      const next = () => {
        if (i === calls.length) { resolve(); return; }
        const [method, params] = calls[i];
        ws.send(JSON.stringify({ type: "req", id: `r${i}`, method, params }));
      };
      ws.onmessage = (e) => {
        const f = JSON.parse(e.data);
        if (f.event === "connect.challenge") {
          ws.send(JSON.stringify({ type: "req", id: "c", method: "connect", params: { minProtocol: 3, maxProtocol: 4,
            client: { id: "webchat-ui", version: "t", platform: "web", mode: "webchat" }, role: "operator",
            scopes: ["operator.read", "operator.write"], auth: { token } } }));
        } else if (f.id === "c") {
          next();
        } else if (f.type === "res" && f.id === `r${i}`) {
          if (!f.ok) { reject(new Error(`${calls[i][0]}: ${JSON.stringify(f.error)}`)); return; }
          out.push(f.payload); i++; next();
        }
      };
    });
    ws.close();
    return out;
  }, [TOKEN, calls]);
}

describe("WebChat: a newcomer's first hour", () => {
  let provider, gw, browser, page, frames;
  const errors = [];

  before(async () => {
    provider = await startFakeProvider();
    gw = await startGateway(provider);
    browser = await launchBrowser();
    page = await browser.context.newPage();
    await page.setViewportSize({ width: 1280, height: 800 });
    frames = recordFrames(page);
    page.on("pageerror", (e) => errors.push(e.message));
    page.on("dialog", (d) => d.accept());
    await page.goto(`${gw.url}/#token=${TOKEN}`);
    await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  const row = (key) => page.locator(`[data-testid="session-row"][data-key="agent:main:${key}"]`);
  const title = () => page.locator("#session-title").textContent();

  test("250 chats: the oldest is reached by scrolling; an old archived chat is restored; the open chat is always shown", async () => {
    const t0 = Date.now();
    // 105 archived first (a000 archived first: the oldest of them), then 250 live ones (c000 the oldest).
    const calls = [];
    for (let i = 0; i < 105; i++) calls.push(["sessions.create", { key: `a${pad(i)}`, label: `Archived ${pad(i)}` }]);
    for (let i = 0; i < 105; i++) calls.push(["sessions.patch", { key: `a${pad(i)}`, archived: true }]);
    for (let i = 0; i < 250; i++) {
      calls.push(["sessions.create", { key: `c${pad(i)}`, label: `Chat ${pad(i)}` }]);
      if (i === 0) calls.push(["chat.inject", { sessionKey: "c000", message: "the oldest chat's only message" }]);
    }
    await rpc(page, calls);
    console.log(`# 355 sessions made in ${Date.now() - t0} ms`);
    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor();
    await row("c249").waitFor();
    const first = await page.locator('#session-list [data-testid="session-row"]').count();
    assert.ok(first < 250, `the first page is not the whole list (${first} rows)`);
    assert.equal(await row("c000").count(), 0, "the oldest is not on the first page");
    // Scroll the list to its end until the oldest shows.
    const nav = page.locator("#sidebar nav");
    await waitFor("the oldest chat after scrolling", async () => {
      await nav.evaluate((n) => { n.scrollTop = n.scrollHeight; });
      return (await row("c000").count()) === 1;
    }, 60000);
    const keys = await page.$$eval('#session-list [data-testid="session-row"]', (els) => els.map((e) => e.dataset.key));
    assert.equal(new Set(keys).size, keys.length, "no chat listed twice");
    for (let i = 0; i < 250; i++) assert.ok(keys.includes(`agent:main:c${pad(i)}`), `c${pad(i)} listed`);
    assert.ok(!keys.some((k) => k.startsWith("agent:main:a")), "archived chats are not among the live ones");
    assert.ok(await page.locator("#session-list .group").count() >= 1, "grouped by date");
    await row("c000").locator(".open").click();
    await waitFor("the oldest chat open", async () => (await title()) === "Chat 000");
    assert.equal(new URL(page.url()).hash, "#chat=agent:main:c000", "its address");

    // Archived: 105 of them, the oldest (a000) on the second page of the Archived section.
    await page.locator("#archived summary").click();
    const archived = page.locator("#archived");
    await waitFor("the oldest archived chat after scrolling", async () => {
      await archived.evaluate((n) => { n.scrollTop = n.scrollHeight; });
      return (await page.locator('#archived-list [data-key="agent:main:a000"]').count()) === 1;
    }, 60000);
    assert.equal(await page.locator('#archived-list [data-testid="session-row"]').count(), 105, "every archived chat, once");
    const a0 = page.locator('#archived-list [data-key="agent:main:a000"]');
    await a0.locator('[data-testid="row-menu"]').click();
    await a0.locator('[data-testid="restore"]').click();
    await waitFor("a000 restored in sessions.json", () => index(gw)["agent:main:a000"] && !("archivedAt" in index(gw)["agent:main:a000"]));
    // Restored in its place by date: the oldest of all, at the end of the list.
    await waitFor("a000 among the live chats", async () => {
      await nav.evaluate((n) => { n.scrollTop = n.scrollHeight; });
      return (await page.locator('#session-list [data-key="agent:main:a000"]').count()) === 1;
    }, 60000);
    assert.equal(await page.locator('#session-list [data-testid="session-row"]').last().getAttribute("data-key"), "agent:main:a000");

    // A reload on the oldest chat's address: its row is shown at once, with its title and count.
    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor();
    await waitFor("the open chat's title", async () => (await title()) === "Chat 000");
    const pinned = row("c000");
    await pinned.waitFor();
    assert.match(await pinned.textContent(), /Chat 000.*1 message/, "the open chat's row, not \"New chat · 0 messages\"");
    // The title shows before the history is drawn: wait for it (a loaded machine draws it later).
    await waitFor("the open chat's one message", async () => (await page.locator('[data-testid="message"]').count()) === 1);
    assert.deepEqual(errors, []);
  });

  test("a chat address opens in a new tab; Back and Forward move between chats", async () => {
    const tab = await browser.context.newPage();
    try {
      await tab.goto(`${gw.url}/#chat=agent:main:c005`);
      await tab.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
      await waitFor("chat 005 in the new tab", async () => (await tab.locator("#session-title").textContent()) === "Chat 005");
      assert.equal(await tab.locator('[data-testid="session-row"].current').getAttribute("data-key"), "agent:main:c005");
      // Each row is a link to that address (so a middle click opens it in a tab).
      assert.equal(await tab.locator('[data-testid="session-row"][data-key="agent:main:c249"] a.open').getAttribute("href"), "#chat=agent:main:c249");
    } finally {
      await tab.close();
    }
    await row("c249").locator(".open").click();
    await waitFor("chat 249", async () => (await title()) === "Chat 249");
    await row("c248").locator(".open").click();
    await waitFor("chat 248", async () => (await title()) === "Chat 248");
    await page.goBack();
    await waitFor("Back: chat 249", async () => (await title()) === "Chat 249");
    assert.equal(new URL(page.url()).hash, "#chat=agent:main:c249");
    await page.goBack();
    await waitFor("Back: chat 000", async () => (await title()) === "Chat 000");
    await page.goForward();
    await waitFor("Forward: chat 249", async () => (await title()) === "Chat 249");
    assert.equal(await page.locator('[data-testid="session-row"].current').getAttribute("data-key"), "agent:main:c249");
  });

  test("a 2,500-message chat scrolls up to its first message; a search hit in message 10 opens it", async () => {
    const t0 = Date.now();
    const calls = [["sessions.create", { key: "long", label: "Long chat" }]];
    for (let i = 0; i < 2500; i++) {
      calls.push(["chat.inject", { sessionKey: "long", message: i === 10 ? "message 10 mentions the zebraquartz" : `message ${i}` }]);
    }
    await rpc(page, calls);
    console.log(`# 2,500 messages injected in ${Date.now() - t0} ms`);
    await page.evaluate(() => { location.hash = "#chat=agent:main:long"; });
    await waitFor("the long chat", async () => (await title()) === "Long chat");
    await waitFor("its last message", async () => (await page.locator('[data-testid="message"]').last().textContent()).includes("message 2499"));
    const log = page.locator("#log");
    const t1 = Date.now();
    await waitFor("the first message after scrolling up", async () => {
      await log.evaluate((l) => { l.scrollTop = 0; });
      return (await page.locator('[data-testid="message"]').first().textContent()).includes("message 0");
    }, 120000);
    console.log(`# scrolled from message 2,499 to message 0 in ${Date.now() - t1} ms`);
    const texts = await page.$$eval('[data-testid="message"] .body', (els) => els.map((e) => e.textContent.trim()));
    assert.equal(texts.length, 2500, "every message once");
    for (let i = 0; i < 2500; i += 1) if (i !== 10) assert.equal(texts[i], `message ${i}`);
    assert.equal(await page.locator('[data-testid="load-older"]').count(), 0, "nothing older is offered");
    assert.ok(await page.locator('[data-testid="day-separator"]').count() >= 1, "a date separator");

    // Another chat, then the search hit: the long chat opens from its newest window and reaches message 10.
    await row("c247").locator(".open").click();
    await waitFor("chat 247", async () => (await title()) === "Chat 247");
    await page.keyboard.press("Control+k");
    assert.equal(await page.evaluate(() => document.activeElement.id), "search-input", "Ctrl+K focuses the search");
    await page.keyboard.type("zebraquartz");
    await page.keyboard.press("Enter");
    const hit = page.locator('[data-testid="search-hit"][data-key="agent:main:long"]');
    await hit.waitFor({ timeout: 60000 });
    await hit.click();
    const shown = page.locator("#log .hit");
    await shown.waitFor({ timeout: 60000 });
    assert.match(await shown.textContent(), /message 10 mentions the zebraquartz/);
    assert.ok(await shown.isVisible(), "scrolled into view");
    assert.equal(await page.locator('[data-testid="error"]').isVisible(), false, "no error");

    assert.deepEqual(errors, []);
  });

  test("Esc stops a streaming reply; ↑ edits the last message; ? lists the shortcuts", async () => {
    await row("c246").locator(".open").click();
    await waitFor("chat 246", async () => (await title()) === "Chat 246");
    await page.locator('[data-testid="composer"]').fill("Tell me a long one [slow]");
    await page.keyboard.press("Enter");
    await waitFor("streamed words", async () => /word2/.test((await page.locator('[data-testid="streaming"]').textContent({ timeout: 500 })) || ""));
    assert.equal(await page.locator("#log").getAttribute("aria-busy"), "true", "the log is busy while the reply streams");
    await page.keyboard.press("Escape");
    await waitFor("the aborted reply on disk", () => readTranscript(gw.stateDir, "agent:main:c246")
      .some((e) => e.type === "message" && e.message.role === "assistant" && e.message.openclawAbort));
    assert.ok(frames.some((f) => f.dir === "out" && f.frame.method === "chat.abort"), "Esc sent chat.abort");
    await waitFor("Stop disabled again", async () => page.locator('[data-testid="stop"]').isDisabled());
    assert.equal(await page.locator("#log").getAttribute("aria-busy"), null);
    const said = readTranscript(gw.stateDir, "agent:main:c246").filter((e) => e.type === "message" && e.message.role === "user");
    assert.deepEqual(said.map((e) => textOf(e.message)), ["Tell me a long one [slow]"]);

    await page.locator('[data-testid="composer"]').focus();
    await page.keyboard.press("ArrowUp");
    const edit = page.locator('[data-testid="edit-input"]');
    await edit.waitFor();
    assert.equal(await edit.inputValue(), "Tell me a long one [slow]", "↑ opened the last message for editing");
    await page.keyboard.press("Escape");
    await waitFor("the editor closed", async () => (await edit.count()) === 0);

    // The chat list is one tab stop; the arrow keys move inside it, → opens a row's menu.
    const tabbable = await page.$$eval("#session-list a, #session-list button", (els) => els.filter((e) => e.tabIndex >= 0).map((e) => e.closest("li").dataset.key));
    assert.deepEqual(tabbable, ["agent:main:c246"], "one tab stop: the open chat's row");
    await page.locator('#session-list [data-key="agent:main:c246"] a.open').focus();
    await page.keyboard.press("ArrowDown");
    assert.equal(await page.evaluate(() => document.activeElement.closest("li").dataset.key), "agent:main:c245");
    await page.keyboard.press("ArrowRight");
    assert.equal(await page.evaluate(() => document.activeElement.dataset.testid), "rename", "the menu's first item");
    await page.keyboard.press("Escape");
    assert.equal(await page.evaluate(() => document.activeElement.closest("li").dataset.key), "agent:main:c245", "back on the row");

    // Ctrl+Shift+O: a new chat, at its own address.
    const before = Object.keys(index(gw)).length;
    await page.keyboard.press("Control+Shift+O");
    await waitFor("a new chat's address", () => /^#chat=agent:main:dashboard:/.test(new URL(page.url()).hash));
    assert.equal(Object.keys(index(gw)).length, before + 1, "one session created");
    await page.goBack();
    await waitFor("back on chat 246", async () => (await title()) === "Chat 246");

    await page.locator("#log").focus();
    await page.keyboard.press("?");
    await page.locator('[data-testid="help"]').waitFor();
    assert.match(await page.locator('[data-testid="help"]').textContent(), /Stop the reply.*New chat.*Search all chats/s);
    await page.keyboard.press("Escape");
    await waitFor("help closed", async () => !(await page.locator('[data-testid="help"]').isVisible()));
    assert.deepEqual(errors, []);
  });

  test("rename saves on Enter only and keeps the row's place; an archived chat is read-only until restored; copy, jump to latest; one place for an error", async () => {
    // The row after c245 (c244, untouched) stays after it; c245 does not go to the top.
    const around = () => page.$$eval('#session-list [data-testid="session-row"]', (els) => {
      const keys = els.map((e) => e.dataset.key);
      const i = keys.indexOf("agent:main:c245");
      return [i === 0, keys[i + 1]];
    });
    const r = row("c245");
    const stamp = index(gw)["agent:main:c245"].updatedAt;
    await r.locator('[data-testid="row-menu"]').click();
    await r.locator('[data-testid="rename"]').click();
    await page.locator('[data-testid="rename-input"]').fill("Not saved");
    await page.locator("#log").click(); // leaving the field keeps the old name
    await waitFor("the old title back", async () => (await r.locator('[data-testid="session-title"]').textContent()) === "Chat 245");
    assert.equal(index(gw)["agent:main:c245"].label, "Chat 245", "nothing saved on blur");
    await r.locator('[data-testid="row-menu"]').click();
    await r.locator('[data-testid="rename"]').click();
    await page.locator('[data-testid="rename-input"]').fill("# **Saved** name");
    await page.locator('[data-testid="rename-input"]').press("Enter");
    await waitFor("the label in sessions.json", () => index(gw)["agent:main:c245"].label === "# **Saved** name");
    await page.waitForTimeout(600); // the list is listed again after sessions.changed
    assert.deepEqual(await around(), [false, "agent:main:c244"], "renaming did not move the chat");
    assert.equal(index(gw)["agent:main:c245"].updatedAt, stamp);
    assert.equal(await r.locator('[data-testid="session-title"]').textContent(), "# **Saved** name", "a label is shown as typed");

    // A derived title is plain text, and a slash command is none.
    const titles = await page.evaluate(async () => {
      const { titleOf } = await import("/webchat/js/sessions.js");
      return [titleOf({ derivedTitle: "## Plan a **trip** to [Lisbon](https://example.com) with `jq`" }), titleOf({ derivedTitle: "/status" })];
    });
    assert.deepEqual(titles, ["Plan a trip to Lisbon with jq", "New chat"]);

    // Archiving the open chat: the composer says why it is read-only, Restore gives it back.
    await row("c244").locator(".open").click();
    await waitFor("chat 244", async () => (await title()) === "Chat 244");
    // A provider error: shown once, in the thread, not also in the banner.
    await page.locator('[data-testid="composer"]').fill("this one will [fail]");
    await page.keyboard.press("Enter");
    await waitFor("the error in the thread", async () => (await page.locator(".msg.error").count()) === 1);
    await page.waitForTimeout(300);
    assert.equal(await page.locator('[data-testid="error"]').isVisible(), false, "no second copy in the banner");
    await row("c244").locator('[data-testid="row-menu"]').click();
    await row("c244").locator('[data-testid="archive"]').click();
    await page.locator('[data-testid="readonly"]').waitFor();
    assert.match(await page.locator('[data-testid="readonly"]').textContent(), /archived/);
    assert.ok(await page.locator('[data-testid="composer"]').isDisabled(), "no typing into an archived chat");
    await waitFor("no edit buttons", async () => (await page.locator('[data-testid="edit"]').count()) === 0);
    await page.locator('[data-testid="readonly-restore"]').click();
    await waitFor("writable again", async () => page.locator('[data-testid="composer"]').isEnabled());
    await waitFor("the edit buttons back", async () => (await page.locator('[data-testid="edit"]').count()) === 1);
    assert.ok(!("archivedAt" in index(gw)["agent:main:c244"]));

    // A deleted chat: its transcript is read-only under Archived, and comes back as a new chat.
    const sid = index(gw)["agent:main:c246"].sessionId;
    await row("c246").locator('[data-testid="row-menu"]').click();
    await row("c246").locator('[data-testid="delete"]').click();
    await waitFor("c246 gone from sessions.json", () => !("agent:main:c246" in index(gw)));
    const file = page.locator(`#archive-files [data-file^="${sid}.jsonl.deleted."] button`);
    await file.waitFor({ state: "attached" });
    if (!(await page.locator("#archived").evaluate((d) => d.open))) await page.locator("#archived summary").click();
    await file.click();
    await waitFor("its messages", async () => (await page.locator('[data-testid="message"][data-role="user"]').first().textContent()).includes("Tell me a long one"));
    assert.match(await page.locator('[data-testid="readonly"]').textContent(), /deleted chat/);
    assert.ok(await page.locator('[data-testid="composer"]').isDisabled(), "a deleted chat's transcript is read-only");
    await page.locator('[data-testid="readonly-restore"]').click();
    await waitFor("a new chat with its messages", async () => /^#chat=agent:main:import:/.test(new URL(page.url()).hash)
      && (await page.locator('[data-testid="message"][data-role="user"]').first().textContent()).includes("Tell me a long one"));
    assert.ok(await page.locator('[data-testid="composer"]').isEnabled(), "writable");
    const restored = decodeURIComponent(new URL(page.url()).hash.slice("#chat=".length));
    assert.ok(index(gw)[restored], "the restored chat is in sessions.json");

    // Copy a message; jump to latest in the long chat.
    await browser.context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: gw.url });
    const user = page.locator('[data-testid="message"][data-role="user"]').last();
    await user.hover();
    await user.locator('[data-testid="copy-message"]').click();
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "Tell me a long one [slow]");
    assert.equal(await user.getAttribute("aria-label"), "You", "a message names its author");
    await page.evaluate(() => { location.hash = "#chat=agent:main:long"; });
    await waitFor("the long chat", async () => (await title()) === "Long chat");
    await waitFor("its last message", async () => (await page.locator('[data-testid="message"]').last().textContent()).includes("message 2499"));
    await waitFor("the jump button once scrolled up", async () => {
      await page.locator("#log").evaluate((l) => { l.scrollTop = l.scrollHeight / 2; });
      return page.locator('[data-testid="jump-latest"]').isVisible();
    });
    await page.locator('[data-testid="jump-latest"]').click();
    await waitFor("at the bottom", () => page.locator("#log").evaluate((l) => l.scrollHeight - l.scrollTop - l.clientHeight < 4));

    // A brief disconnect: the status says it, no red banner.
    await gw.kill();
    await page.locator('[data-testid="status"].bad').waitFor({ timeout: 20000 });
    await page.waitForTimeout(500);
    assert.equal(await page.locator('[data-testid="error"]').isVisible(), false, "no error banner while reconnecting");
    await gw.restart();
    await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
    await page.waitForTimeout(500);
    assert.equal(await page.locator('[data-testid="error"]').isVisible(), false);

    // A wrong token: the composer is disabled and says why.
    const other = await launchBrowser();
    try {
      const p = await other.context.newPage();
      await p.goto(`${gw.url}/#token=not-the-token`);
      await p.locator("#token-banner").waitFor();
      await waitFor("the composer disabled", async () => p.locator('[data-testid="composer"]').isDisabled());
      assert.match(await p.locator('[data-testid="readonly"]').textContent(), /token/);
    } finally {
      await other.close();
    }
    assert.deepEqual(errors, []);
  });

  test("Ctrl+K pressed while a clicked chat still loads keeps the search focused", async () => {
    await row("c247").locator(".open").click();
    await waitFor("chat 247", async () => (await title()) === "Chat 247");
    // The 2,500-message chat takes a moment to load: the search asked for meanwhile keeps the focus.
    await row("long").locator(".open").click();
    await page.keyboard.press("Control+k");
    await waitFor("the long chat", async () => (await page.locator('[data-testid="message"]').last().textContent()).includes("message 2499"));
    await page.waitForTimeout(300);
    assert.equal(await page.evaluate(() => document.activeElement.id), "search-input", "the search keeps the focus");
    assert.deepEqual(errors, []);
  });
});
