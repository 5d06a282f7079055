// Real-browser tests of the WebChat as a client of the session tree (issue 10), one per item:
// Markdown (rendered, sanitized, highlighted, "show all"), the outbox (Stop keeps a queued
// follow-up; a message typed while the gateway is down survives a reload and is written once after
// the restart; drafts; IME-safe Enter), edit/regenerate/branch switching checked against the real
// Pi library, the sidebar (rename, archive, restore, delete, /new), onboarding, attachments, and
// screenshots at 1280 px, 390 px and in dark mode. Each asserts the DOM, the frames and the JSONL.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import {
  PINCER_BIN, REPO, TOKEN, exactlyOnce, fakeReply, gatewayEnv, launchBrowser, readTranscript, recordFrames,
  startFakeProvider, startGateway, textOf, waitFor,
} from "./harness.mjs";

const SHOTS = process.env.PINCER_WEBCHAT_SHOTS || "/tmp/pincer-webchat-shots";
const ORACLE = process.env.PINCER_PI_ORACLE || path.join(REPO, "target/pi-oracle");
const PNG_1PX = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==", "base64");

const sessionsDir = (gw) => path.join(gw.stateDir, "agents/main/sessions");
const index = (gw) => JSON.parse(fs.readFileSync(path.join(sessionsDir(gw), "sessions.json"), "utf8"));
const transcriptFile = (gw, key = "agent:main:main") => path.join(sessionsDir(gw), `${index(gw)[key].sessionId}.jsonl`);
const msgEntries = (lines) => lines.filter((e) => e.type === "message");
const plain = (msgs) => msgs.filter((m) => m.role === "user" || m.role === "assistant").map((m) => [m.role, textOf(m).trim()]);

/** The real Pi library's buildSessionContext for a file (at its leaf, or at `leaf`). */
function piContext(file, leaf) {
  assert.ok(fs.existsSync(path.join(ORACLE, "node_modules/@mariozechner/pi-coding-agent")),
    `the Pi oracle is not installed at ${ORACLE}: copy /work/shared/pi-oracle there and npm ci (scripts/test does)`);
  const out = execFileSync("node", [path.join(ORACLE, "context.mjs"), file, ...(leaf ? [leaf] : [])], { encoding: "utf8" });
  return JSON.parse(out);
}

/** A chat-completions request's messages as [role, text] (the system prompt left out). */
const requestMessages = (body) => body.messages.filter((m) => m.role !== "system").map((m) => [m.role, textOf(m).trim()]);

describe("WebChat as a client of the session tree", () => {
  let provider, gw, browser;
  const pages = [];

  before(async () => {
    provider = await startFakeProvider();
    gw = await startGateway(provider, "", { extraModels: ["fake-model-2"] });
    browser = await launchBrowser();
    fs.mkdirSync(SHOTS, { recursive: true });
  });
  after(async () => {
    for (const p of pages) await p.close().catch(() => {});
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  async function openPage(viewport) {
    const page = await browser.context.newPage();
    if (viewport) await page.setViewportSize(viewport);
    pages.push(page);
    const frames = recordFrames(page);
    const errors = [];
    page.on("pageerror", (e) => errors.push(e.message));
    // confirm() is accepted; prompt() answers the next of page.answers (else its default).
    page.answers = [];
    page.on("dialog", (d) => d.accept(d.type() === "prompt" && page.answers.length ? page.answers.shift() : undefined));
    await page.goto(`${gw.url}/#token=${TOKEN}`);
    await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
    return { page, frames, errors };
  }

  const bodies = (page, sel) => page.$$eval(sel, (els) => els.map((e) => (e.querySelector(".body") || e).textContent.trim()));

  async function send(page, text) {
    await page.locator('[data-testid="composer"]').fill(text);
    await page.locator('[data-testid="send"]').click();
  }
  async function waitForText(page, role, text) {
    await waitFor(`a ${role} message ${JSON.stringify(text.slice(0, 60))}`, async () =>
      (await bodies(page, `[data-testid="message"][data-role="${role}"]`)).includes(text));
  }
  const sentWith = (frames, text) => frames.filter((f) => f.dir === "out" && f.frame.method === "chat.send" && f.frame.params.message === text);

  let main;

  test("1/2 Markdown renders sanitized: code highlighted with a copy button, tables, safe links; long texts show all", async () => {
    main = await openPage({ width: 1280, height: 800 });
    const { page, errors } = main;
    const said = "**bold** and a [link](https://example.com/x)\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n```js\nconst x = 1;\n```\n\n" +
      "<img src=x onerror=\"window.__pwned=1\"><script>window.__pwned=2</script><a href=\"javascript:window.__pwned=3\">js</a>";
    await send(page, said);
    await waitFor("the reply", async () => (await page.locator('[data-testid="message"][data-role="assistant"] table').count()) === 1);
    for (const role of ["user", "assistant"]) {
      const m = page.locator(`[data-testid="message"][data-role="${role}"]`).last();
      assert.equal(await m.locator("pre code.hljs").count(), 1, `${role}: a highlighted <pre><code>`);
      assert.ok((await m.locator("pre code .hljs-keyword").count()) >= 1, `${role}: highlight.js marked the keyword`);
      assert.equal(await m.locator('.code-block:has(pre) > [data-testid="copy-code"]').count(), 1, `${role}: a copy button on the code block, outside its scrolling box`);
      assert.equal(await m.locator("table td").count(), 2, `${role}: the table`);
      assert.equal(await m.locator("strong").first().textContent(), "bold");
      const link = m.locator('a[href="https://example.com/x"]');
      assert.equal(await link.getAttribute("rel"), "noopener noreferrer");
      assert.equal(await link.getAttribute("target"), "_blank");
    }
    assert.equal(await page.locator("#log script").count(), 0, "no <script> survives");
    assert.equal(await page.locator("#log [onerror]").count(), 0, "no onerror attribute survives");
    assert.equal(await page.locator('#log a[href^="javascript:"]').count(), 0, "no javascript: link survives");
    await page.waitForTimeout(300);
    assert.equal(await page.evaluate(() => window.__pwned), undefined, "the injected code never ran");
    await browser.context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: gw.url });
    await page.locator('.code-block [data-testid="copy-code"]').first().click();
    await waitFor("the copy button to confirm", async () => (await page.locator('.code-block [data-testid="copy-code"]').first().textContent()) === "Copied", 5000);
    assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "const x = 1;\n", "the code is on the clipboard");

    // On disk the text is as typed (rendering is the page's business).
    exactlyOnce(msgEntries(readTranscript(gw.stateDir)).map((e) => e.message), "user", said);

    // Longer than history's 8,000-character cut: after a reload "Show all" fetches the whole entry.
    const long = "Long: " + "abcdefghij".repeat(900);
    await send(page, long);
    await waitForText(page, "assistant", fakeReply(long));
    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor();
    const user = page.locator('[data-testid="message"][data-role="user"]').last();
    await user.locator('[data-testid="show-all"]').waitFor();
    assert.ok((await user.locator(".body").textContent()).length < long.length, "history cut the text");
    await user.locator('[data-testid="show-all"]').click();
    await waitFor("the whole text", async () => (await page.locator('[data-testid="message"][data-role="user"]').last().locator(".body").textContent()).trim() === long);
    assert.deepEqual(errors, []);
  });

  test("3 Stop with a queued follow-up: the follow-up waits visibly, is sent after the stop and written once", async () => {
    const { page, frames } = main;
    // IME: Enter while composing does not send.
    await page.locator('[data-testid="composer"]').fill("compos");
    await page.locator('[data-testid="composer"]').dispatchEvent("compositionstart");
    await page.locator('[data-testid="composer"]').press("Enter");
    await page.locator('[data-testid="composer"]').dispatchEvent("compositionend");
    assert.equal(sentWith(frames, "compos").length + sentWith(frames, "compos\n").length, 0, "no send while composing");
    assert.equal(await page.locator('[data-testid="outbox-item"]').count(), 0);

    const slow = "Long story [slow]";
    await send(page, slow);
    await waitFor("streamed words", async () => /word2/.test((await page.locator('[data-testid="streaming"]').textContent({ timeout: 500 })) || ""));
    const follow = "Follow-up typed while streaming";
    await send(page, follow);
    const item = page.locator('[data-testid="outbox-item"]');
    await item.waitFor();
    assert.match(await item.textContent(), /Follow-up typed while streaming.*waiting to send/);
    assert.equal(sentWith(frames, follow).length, 0, "not sent while the reply streams");
    await page.locator('[data-testid="stop"]').click();
    await waitForText(page, "assistant", fakeReply(follow));
    await waitFor("the outbox to empty", async () => (await item.count()) === 0);

    const slowKey = sentWith(frames, slow)[0].frame.params.idempotencyKey;
    const abort = frames.find((f) => f.dir === "out" && f.frame.method === "chat.abort");
    assert.equal(abort.frame.params.runId, slowKey, "Stop aborted only the streaming run");
    const sends = sentWith(frames, follow);
    assert.equal(new Set(sends.map((f) => f.frame.params.idempotencyKey)).size, 1, "one idempotencyKey");
    const msgs = msgEntries(readTranscript(gw.stateDir)).map((e) => e.message);
    exactlyOnce(msgs, "user", follow);
    exactlyOnce(msgs, "assistant", fakeReply(follow));
    assert.ok(msgs.some((m) => m.role === "assistant" && m.openclawAbort), "the stopped reply was kept as aborted");
  });

  test("5 edit makes a new branch from the message's parent; Pi's context is what the model got; switching persists and shows on a second page", async () => {
    const { page, frames } = main;
    await send(page, "Edit me: original");
    await waitForText(page, "assistant", fakeReply("Edit me: original"));
    const orig = page.locator('[data-testid="message"][data-role="user"]').last();
    await orig.locator('[data-testid="edit"]').click();
    await page.locator('[data-testid="edit-input"]').fill("Edit me: changed");
    await page.locator('[data-testid="edit-save"]').click();
    await waitForText(page, "assistant", fakeReply("Edit me: changed"));
    assert.ok(!(await bodies(page, '[data-testid="message"]')).includes("Edit me: original"), "the old branch is off screen");

    const file = transcriptFile(gw);
    const lines = readTranscript(gw.stateDir);
    const users = msgEntries(lines).filter((e) => e.message.role === "user");
    const a = users.find((e) => textOf(e.message) === "Edit me: original");
    const b = users.find((e) => textOf(e.message) === "Edit me: changed");
    assert.ok(a && b && a.id !== b.id);
    assert.equal(b.parentId, a.parentId, "the edited message hangs under the original's parent");
    assert.ok(frames.some((f) => f.dir === "out" && f.frame.method === "sessions.rewind" && f.frame.params.entryId === a.id), "edit rewound over the protocol");
    const send2 = sentWith(frames, "Edit me: changed")[0];
    assert.equal(send2.frame.params.expectedLeafEntryId, a.parentId, "and sent with OpenClaw's expectedLeafEntryId guard");

    // The real Pi library reads the file to the same context the fake provider was given.
    const ctx = piContext(file);
    const got = requestMessages(provider.requests[provider.requests.length - 1]);
    const pi = plain(ctx.context.messages);
    assert.deepEqual(pi.slice(0, -1), got, "Pi's context before the reply is what the model received");
    assert.deepEqual(pi[pi.length - 1], ["assistant", fakeReply("Edit me: changed")]);
    assert.ok(!got.some(([, t]) => t === "Edit me: original"), "the abandoned message is not in the model's context");

    // The navigator: 2/2 on the edited message; ‹ goes back to the original branch.
    const edited = page.locator('[data-testid="message"][data-role="user"]').last();
    assert.equal(await edited.locator('[data-testid="branch-pos"]').textContent(), "2/2");
    await edited.locator('[data-testid="branch-prev"]').click();
    await waitForText(page, "user", "Edit me: original");
    const last = readTranscript(gw.stateDir).at(-1);
    const origReply = msgEntries(readTranscript(gw.stateDir)).find((e) => e.parentId === a.id);
    assert.equal(last.type, "leaf", "the switch is a leaf entry in the file");
    assert.equal(last.targetId, origReply.id, "to the tip of the original branch");
    assert.equal(last.parentId, last.targetId, "hung under its target, so Pi reads the same leaf");
    const after = plain(piContext(file).context.messages);
    assert.deepEqual(after.slice(-2), [["user", "Edit me: original"], ["assistant", fakeReply("Edit me: original")]], "Pi's context follows the switch");
    assert.equal(await page.locator('[data-testid="message"][data-role="user"]').last().locator('[data-testid="branch-pos"]').textContent(), "1/2");

    // Persisted: a reload shows the same branch; a second page shows it and its switch reaches us live.
    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor();
    await waitForText(page, "user", "Edit me: original");
    const second = await openPage();
    await waitForText(second.page, "user", "Edit me: original");
    await second.page.locator('[data-testid="message"][data-role="user"]').last().locator('[data-testid="branch-next"]').click();
    await waitForText(page, "user", "Edit me: changed");
    assert.ok(!(await bodies(page, '[data-testid="message"][data-role="user"]')).includes("Edit me: original"), "the first page followed live");

    // The model's context is the active branch's.
    await send(page, "After the switch");
    await waitForText(page, "assistant", fakeReply("After the switch"));
    const req = requestMessages(provider.requests[provider.requests.length - 1]);
    assert.ok(req.some(([, t]) => t === "Edit me: changed") && !req.some(([, t]) => t === "Edit me: original"), JSON.stringify(req));
    assert.deepEqual(plain(piContext(file).context.messages).slice(0, -1), req);
    assert.deepEqual(second.errors, []);
    await second.page.close();
  });

  test("5 regenerate makes a sibling reply under the same user row, from that row's context", async () => {
    const { page } = main;
    const before = provider.requests.length;
    const reply = page.locator('[data-testid="message"][data-role="assistant"]').last();
    await reply.locator('[data-testid="regenerate"]').click();
    await waitFor("a second reply on disk", () => {
      const e = msgEntries(readTranscript(gw.stateDir));
      const u = e.find((x) => x.message.role === "user" && textOf(x.message) === "After the switch");
      return e.filter((x) => x.parentId === u.id && x.message.role === "assistant").length === 2;
    });
    const entries = msgEntries(readTranscript(gw.stateDir));
    const u = entries.find((x) => x.message.role === "user" && textOf(x.message) === "After the switch");
    const sibs = entries.filter((x) => x.parentId === u.id);
    assert.equal(sibs.length, 2, "two replies, both children of the user row");
    exactlyOnce(entries.map((e) => e.message), "user", "After the switch");
    assert.equal(provider.requests.length, before + 1);
    assert.deepEqual(requestMessages(provider.requests.at(-1)), plain(piContext(transcriptFile(gw), u.id).context.messages),
      "the model got the context at the user row");
    await waitFor("the navigator on the reply", async () =>
      (await page.locator('[data-testid="message"][data-role="assistant"]').last().locator('[data-testid="branch-pos"]').textContent({ timeout: 500 })) === "2/2");
  });

  test("4 sidebar: new, rename, archive, restore, delete and /new, reflected in sessions.json and on disk", async () => {
    const { page } = main;
    await page.locator('[data-testid="new-session"]').click();
    await waitFor("an empty chat", async () => (await page.locator('[data-testid="message"]').count()) === 0);
    await send(page, "Sidebar chat");
    await waitForText(page, "assistant", fakeReply("Sidebar chat"));
    const key = await page.evaluate(() => localStorage.getItem("pincer.session"));
    assert.match(key, /^agent:main:dashboard:/);
    const row = page.locator(`[data-testid="session-row"][data-key="${key}"]`);
    await waitFor("the title and count", async () => /Sidebar chat/.test(await row.textContent()) && /2 messages/.test(await row.textContent()));

    await row.locator('[data-testid="row-menu"]').click();
    await row.locator('[data-testid="rename"]').click();
    await page.locator('[data-testid="rename-input"]').fill("Renamed chat");
    await page.locator('[data-testid="rename-input"]').press("Enter");
    await waitFor("the label in sessions.json", () => index(gw)[key]?.label === "Renamed chat");
    await waitFor("the new title", async () => (await row.locator('[data-testid="session-title"]').textContent()) === "Renamed chat");

    await row.locator('[data-testid="row-menu"]').click();
    await row.locator('[data-testid="archive"]').click();
    await waitFor("archivedAt in sessions.json", () => typeof index(gw)[key]?.archivedAt === "number");
    await waitFor("the row under Archived", async () => (await page.locator(`#archived-list [data-key="${key}"]`).count()) === 1
      && (await page.locator(`#session-list [data-key="${key}"]`).count()) === 0);
    await page.locator("#archived summary").click();
    await page.locator(`#archived-list [data-key="${key}"] [data-testid="row-menu"]`).click();
    await page.locator(`#archived-list [data-key="${key}"] [data-testid="restore"]`).click();
    await waitFor("restored", () => index(gw)[key] && !("archivedAt" in index(gw)[key]));
    await waitFor("the row back in the list", async () => (await page.locator(`#session-list [data-key="${key}"]`).count()) === 1);

    const sid = index(gw)[key].sessionId;
    await page.locator(`#session-list [data-key="${key}"] [data-testid="row-menu"]`).click();
    await page.locator(`#session-list [data-key="${key}"] [data-testid="delete"]`).click();
    await waitFor("the key gone from sessions.json", () => !(key in index(gw)));
    const files = fs.readdirSync(sessionsDir(gw));
    assert.ok(!files.includes(`${sid}.jsonl`) && files.some((f) => f.startsWith(`${sid}.jsonl.deleted.`)), `kept as an archive: ${files}`);
    await waitFor("the deleted transcript listed under Archived", async () => /Sidebar chat/.test(await page.locator("#archive-files").textContent()));
    await waitFor("back on the main chat", async () => (await page.evaluate(() => localStorage.getItem("pincer.session"))) === "agent:main:main");

    // /new: the old messages leave the screen and the old transcript is listed under Archived.
    const oldSid = index(gw)["agent:main:main"].sessionId;
    await waitForText(page, "user", "After the switch");
    await send(page, "/new");
    await waitFor("a fresh chat", async () => !(await bodies(page, '[data-testid="message"]')).some((t) => t.includes("After the switch")));
    await waitFor("the reset transcript under Archived", async () => (await page.locator(`#archive-files [data-file^="${oldSid}.jsonl.reset."]`).count()) === 1);
    await page.locator(`#archive-files [data-file^="${oldSid}.jsonl.reset."] button`).click();
    await waitForText(page, "user", "After the switch");
    assert.equal(await page.locator('[data-testid="edit"]').count(), 0, "an archived transcript is read-only");
    await page.locator('#session-list [data-key="agent:main:main"] .open').click();
    await waitFor("the fresh main chat again", async () => !(await bodies(page, '[data-testid="message"]')).includes("After the switch"));
  });

  test("6 attachments: a preview, the image on disk; an oversized one is refused before sending", async () => {
    const { page, frames } = main;
    await page.locator('[data-testid="attach"]').setInputFiles({ name: "dot.png", mimeType: "image/png", buffer: PNG_1PX });
    await page.locator('[data-testid="attachment-preview"]').waitFor();
    await send(page, "with an image");
    await waitForText(page, "assistant", fakeReply("with an image"));
    const m = msgEntries(readTranscript(gw.stateDir)).map((e) => e.message).find((x) => x.role === "user" && textOf(x) === "with an image");
    const img = m.content.find((b) => b.type === "image");
    assert.equal(img.mimeType, "image/png");
    assert.equal(img.data, PNG_1PX.toString("base64"));
    const before = frames.filter((f) => f.frame.method === "chat.send").length;
    await page.locator('[data-testid="attach"]').setInputFiles({ name: "big.png", mimeType: "image/png", buffer: Buffer.alloc(6 * 1024 * 1024, 1) });
    await waitFor("the size error", async () => /at most 5 MB/.test(await page.locator('[data-testid="error"]').textContent()));
    await send(page, "too big");
    await page.waitForTimeout(300);
    assert.equal(frames.filter((f) => f.frame.method === "chat.send").length, before, "nothing was sent");
    await page.locator('[data-testid="error-dismiss"]').click();
    assert.equal(await page.locator('[data-testid="error"]').isVisible(), false, "the error is dismissible");
    await page.locator('[data-testid="attachment-preview"] button').click();
    await page.locator('[data-testid="composer"]').fill("");
  });

  test("5/6 labels are shown and editable; replies show usage and the time (full date on hover); the model picker sets the session's model", async () => {
    const { page } = main;
    await send(page, "Label me");
    await waitForText(page, "assistant", fakeReply("Label me"));
    const reply = page.locator('[data-testid="message"][data-role="assistant"]').last();
    const id = await reply.getAttribute("data-entry-id");
    page.answers.push("a keeper");
    await reply.locator('[data-testid="set-label"]').click();
    await waitFor("the label on the page", async () => (await page.locator(`[data-entry-id="${id}"] [data-testid="label"]`).textContent({ timeout: 500 })) === "a keeper");
    const label = readTranscript(gw.stateDir).filter((e) => e.type === "label").at(-1);
    assert.deepEqual([label.targetId, label.label], [id, "a keeper"], "a Pi label entry on disk");
    assert.equal(piContext(transcriptFile(gw)).extra.labels[id], "a keeper", "Pi reads the label");
    const again = page.locator(`[data-entry-id="${id}"]`);
    assert.match(await again.locator('[data-testid="usage"]').textContent(), /\d+ in · \d+ out/);
    const title = await again.locator('[data-testid="timestamp"]').getAttribute("title");
    assert.ok(title && title.length > 8, `a full date on hover: ${title}`);

    const picker = page.locator('[data-testid="model-picker"]');
    const options = await picker.locator("option").allTextContents();
    assert.ok(options.includes("fake/fake-model") && options.includes("fake/fake-model-2"), `models.list's models: ${options}`);
    assert.equal(await picker.inputValue(), "fake/fake-model");
    await picker.selectOption("fake/fake-model-2");
    await waitFor("the model in sessions.json", () => index(gw)["agent:main:main"].model === "fake/fake-model-2");
    await send(page, "Which model?");
    await waitForText(page, "assistant", fakeReply("Which model?"));
    assert.equal(provider.requests.at(-1).model, "fake-model-2", "the turn used the session's model");
    await picker.selectOption("fake/fake-model");
    await waitFor("back to the default", () => index(gw)["agent:main:main"].model === "fake/fake-model");
  });

  test("5 a long chat loads its last 200 messages; \"Load older\" fetches the turns before", async () => {
    const { page } = main;
    // 230 injected rows in a chat of their own, over the page's origin.
    const count = await page.evaluate(async (token) => {
      const ws = new WebSocket(`ws://${location.host}/`);
      let n = 0;
      await new Promise((resolve) => {
        ws.onmessage = (e) => {
          const f = JSON.parse(e.data);
          if (f.event === "connect.challenge") {
            ws.send(JSON.stringify({ type: "req", id: "c", method: "connect", params: { minProtocol: 3, maxProtocol: 4,
              client: { id: "webchat-ui", version: "t", platform: "web", mode: "webchat" }, role: "operator",
              scopes: ["operator.read", "operator.write"], auth: { token } } }));
          } else if (f.id === "c") {
            ws.send(JSON.stringify({ type: "req", id: "k", method: "sessions.create", params: { key: "older", label: "Older" } }));
          } else if (f.id === "k" || (f.type === "res" && f.id.startsWith("i"))) {
            if (n === 230) { resolve(); return; }
            ws.send(JSON.stringify({ type: "req", id: `i${n}`, method: "chat.inject", params: { sessionKey: "older", message: `row ${n}` } }));
            n++;
          }
        };
      });
      ws.close();
      return n;
    }, TOKEN);
    assert.equal(count, 230);
    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor();
    await page.locator('[data-testid="session-row"][data-key="agent:main:older"] .open').click();
    await waitForText(page, "assistant", "row 229");
    assert.equal(await page.locator('[data-testid="message"]').count(), 200, "the last 200");
    assert.ok(!(await bodies(page, '[data-testid="message"]')).includes("row 0"));
    await page.locator('[data-testid="load-older"]').click();
    await waitForText(page, "assistant", "row 0");
    assert.equal(await page.locator('[data-testid="message"]').count(), 230);
    assert.equal(await page.locator('[data-testid="load-older"]').count(), 0, "nothing older is left");
    await page.locator('[data-testid="session-row"][data-key="agent:main:main"] .open').click();
    await waitForText(page, "user", "Label me");
  });

  test("5 a compaction is a divider whose summary opens; the turns before it stay on the page", async () => {
    const { page } = main;
    for (const t of ["alpha before compaction", "beta before compaction"]) {
      await send(page, t);
      await waitForText(page, "assistant", fakeReply(t));
    }
    await send(page, "/compact");
    const divider = page.locator('[data-testid="compaction-divider"]');
    await divider.waitFor({ timeout: 30000 });
    const entry = readTranscript(gw.stateDir).filter((e) => e.type === "compaction").at(-1);
    assert.ok(entry?.summary, "a compaction entry with a summary on disk");
    assert.equal(await divider.getAttribute("data-entry-id"), entry.id);
    await divider.locator('[data-testid="compaction-summary"]').click();
    await waitFor("the summary", async () => (await divider.locator('[data-testid="compaction-text"]').textContent({ timeout: 500 })) === entry.summary);
    assert.equal(await divider.locator('[data-testid="compaction-summary"]').getAttribute("aria-expanded"), "true");
    assert.ok((await bodies(page, '[data-testid="message"][data-role="user"]')).includes("alpha before compaction"), "older turns are still shown");
    const injected = page.locator('[data-testid="message"][data-role="assistant"]').last();
    assert.equal(await injected.locator('[data-testid="regenerate"]').count(), 0, "a slash command's answer has no Regenerate");
  });

  test("3 the gateway dies with a message pending: the page resends it after the restart, written once; a closed tab's outbox and draft survive", async () => {
    const { page, frames } = main;
    await gw.kill();
    await page.locator('[data-testid="status"].bad').waitFor({ timeout: 20000 });
    const text = "Typed while the gateway was down";
    await send(page, text);
    await page.locator('[data-testid="outbox-item"]').waitFor();
    assert.match(await page.locator('[data-testid="outbox-item"]').textContent(), /Typed while the gateway was down.*waiting to send/);
    await gw.restart();
    await waitForText(page, "assistant", fakeReply(text));
    await waitFor("the outbox to empty", async () => (await page.locator('[data-testid="outbox-item"]').count()) === 0);
    const keys = new Set(sentWith(frames, text).map((f) => f.frame.params.idempotencyKey));
    assert.equal(keys.size, 1, "every attempt used the same idempotencyKey");
    let msgs = msgEntries(readTranscript(gw.stateDir)).map((e) => e.message);
    assert.equal(exactlyOnce(msgs, "user", text).idempotencyKey, `${[...keys][0]}:user`);
    exactlyOnce(msgs, "assistant", fakeReply(text));

    // The tab is closed while the gateway is down: the outbox (localStorage) sends it from the next tab.
    await gw.kill();
    await page.locator('[data-testid="status"].bad').waitFor({ timeout: 20000 });
    const later = "Typed before the tab was closed";
    await send(page, later);
    await page.locator('[data-testid="outbox-item"]').waitFor();
    await page.locator('[data-testid="composer"]').fill("an unsent draft");
    await page.close();
    await gw.restart();
    main = await openPage({ width: 1280, height: 800 });
    await waitForText(main.page, "assistant", fakeReply(later));
    assert.equal(await main.page.locator('[data-testid="composer"]').inputValue(), "an unsent draft", "the draft survived");
    msgs = msgEntries(readTranscript(gw.stateDir)).map((e) => e.message);
    exactlyOnce(msgs, "user", later);
    exactlyOnce(msgs, "assistant", fakeReply(later));
    await main.page.locator('[data-testid="composer"]').fill("");
  });

  test("8 onboarding: --print-url gives a ready link (the log names it without the token); #token= in an open tab connects; real paths only", async () => {
    // Not a terminal here: the log names the address and `--print-url`, never the token itself.
    assert.ok(gw.log.some((l) => l.includes(`WebChat: open http://127.0.0.1:${gw.port}/ (`) && l.includes("--print-url")), gw.log.join("\n"));
    assert.ok(!gw.log.some((l) => l.includes(TOKEN)), `the token is not logged:\n${gw.log.join("\n")}`);
    const url = execFileSync(PINCER_BIN, ["gateway", "--print-url", "--state-dir", gw.stateDir, "--bind", `127.0.0.1:${gw.port}`],
      { env: gatewayEnv(), encoding: "utf8" }).trim();
    assert.equal(url, `http://127.0.0.1:${gw.port}/#token=${TOKEN}`);
    const fresh = await launchBrowser();
    try {
      const page = await fresh.context.newPage();
      await page.goto(gw.url);
      await page.locator("#token-banner").waitFor();
      assert.ok(!(await page.content()).includes("~/.pincer"), "no made-up path on the page");
      await page.evaluate((t) => { location.hash = `#token=${t}`; }, TOKEN);
      await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
      assert.ok(!new URL(page.url()).hash.includes("token"), "the token left the address bar");
      assert.equal(await page.locator("#token-banner").isVisible(), false);
    } finally {
      await fresh.close();
    }
  });

  test("screenshots at 1280 px, 390 px (drawer) and in dark mode", async () => {
    const { page } = main;
    await send(page, "Show me some **Markdown**:\n\n```rust\nfn main() { println!(\"hi\"); }\n```\n\n| x | y |\n|---|---|\n| 1 | 2 |");
    await waitFor("the reply", async () => (await page.locator('[data-testid="message"][data-role="assistant"] table').count()) >= 1);
    await page.setViewportSize({ width: 1280, height: 800 });
    await page.screenshot({ path: path.join(SHOTS, "webchat-1280.png") });
    // Keyboard and screen readers: every control has a name, and the thread is a live log.
    const unnamed = await page.$$eval("button, select, textarea, input", (els) => els
      .filter((e) => e.offsetParent !== null || e.type === "file")
      .filter((e) => !(e.getAttribute("aria-label") || e.textContent.trim() || (e.id && document.querySelector(`label[for="${e.id}"]`)) || e.closest("label")))
      .map((e) => e.outerHTML.slice(0, 120)));
    assert.deepEqual(unnamed, [], "controls without an accessible name");
    assert.equal(await page.locator("#log").getAttribute("role"), "log");
    await page.locator('[data-testid="composer"]').focus();
    await page.keyboard.type("typed with the keyboard only");
    await page.keyboard.press("Enter");
    await waitForText(page, "assistant", fakeReply("typed with the keyboard only"));
    await page.setViewportSize({ width: 390, height: 844 });
    await page.waitForTimeout(400);
    await page.screenshot({ path: path.join(SHOTS, "webchat-390.png") });
    await page.locator('[data-testid="sidebar-toggle"]').click();
    await page.waitForTimeout(400);
    assert.equal(await page.locator('[data-testid="sidebar-toggle"]').getAttribute("aria-expanded"), "true");
    await page.screenshot({ path: path.join(SHOTS, "webchat-390-drawer.png") });
    await page.keyboard.press("Escape");
    await page.setViewportSize({ width: 1280, height: 800 });
    await page.emulateMedia({ colorScheme: "dark" });
    await page.waitForTimeout(200);
    const bg = await page.evaluate(() => getComputedStyle(document.body).backgroundColor);
    assert.equal(bg, "rgb(17, 20, 24)", "the dark theme follows the system preference");
    await page.screenshot({ path: path.join(SHOTS, "webchat-dark.png") });
    await page.locator('[data-testid="theme-toggle"]').click(); // system → light
    assert.equal(await page.evaluate(() => getComputedStyle(document.body).backgroundColor), "rgb(246, 247, 249)", "the toggle overrides it");
    await page.locator('[data-testid="theme-toggle"]').click(); // light → dark
    await page.emulateMedia({ colorScheme: "light" });
    await page.screenshot({ path: path.join(SHOTS, "webchat-dark-toggle.png") });
  });
});
