// Real-browser end to end tests of Pincer's WebChat page (GET /): Debian's Chromium opens the page
// served by the real `pincer gateway` process, talks to a fake OpenAI-compatible provider through it,
// and after each scenario the transcript JSONL on disk is read back and checked.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  TOKEN, checkChain, exactlyOnce, fakeReply, launchBrowser, readTranscript, recordFrames, startFakeProvider,
  startGateway, textOf, waitFor,
} from "./harness.mjs";

const SCREENSHOT = process.env.PINCER_WEBCHAT_SCREENSHOT || "/tmp/pincer-webchat.png";

// Records every text the streaming bubble showed, so a test can tell a streamed reply from one that
// only appeared whole.
const STREAM_RECORDER = () => {
  window.__streamed = [];
  new MutationObserver(() => {
    for (const el of document.querySelectorAll(".msg.streaming")) {
      const t = el.textContent.trim();
      if (window.__streamed[window.__streamed.length - 1] !== t) window.__streamed.push(t);
    }
  }).observe(document, { subtree: true, childList: true, characterData: true });
};

/** The message text of a bubble, without its meta line. */
const bubbleTexts = (page, selector) =>
  page.$$eval(selector, (els) => els.map((el) => (el.querySelector(".body") || el).textContent.trim()));

describe("WebChat in a real browser", () => {
  let provider, gw, browser;
  const pages = [];

  before(async () => {
    provider = await startFakeProvider();
    gw = await startGateway(provider);
    browser = await launchBrowser();
  });
  after(async () => {
    for (const p of pages) await p.close().catch(() => {});
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  async function openPage() {
    const page = await browser.context.newPage();
    pages.push(page);
    const frames = recordFrames(page);
    const errors = [];
    page.on("pageerror", (e) => errors.push(e.message));
    await page.addInitScript(STREAM_RECORDER);
    await page.goto(`${gw.url}/#token=${TOKEN}`);
    await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
    return { page, frames, errors };
  }

  async function send(page, text) {
    await page.locator('[data-testid="composer"]').fill(text);
    await page.locator('[data-testid="send"]').click();
  }

  /** Waits until the page shows the final (non-streaming) assistant bubble with exactly `text`. */
  async function waitForFinal(page, text) {
    await waitFor(`the final reply ${JSON.stringify(text)}`, async () =>
      (await bubbleTexts(page, ".msg.assistant:not(.streaming)")).includes(text));
  }

  /** The outbox is empty and every user bubble is a persisted entry (session.message). */
  async function allConfirmed(page) {
    await waitFor("the outbox to be empty", async () => (await page.locator('[data-testid="outbox-item"]').count()) === 0);
    const keys = await page.$$eval(".msg.user", (els) => els.map((e) => Boolean(e.dataset.entryId)));
    assert.ok(keys.every(Boolean), "every user bubble carries its transcript entry id");
  }

  let first;

  test("sends a message, streams the reply and shows the final", async () => {
    first = await openPage();
    const { page, frames, errors } = first;
    assert.ok(!new URL(page.url()).hash.includes("token"), "the token is removed from the address bar");
    const said = "Hello from the browser";
    await send(page, said);
    await waitForFinal(page, fakeReply(said));

    // It was streamed: the streaming bubble showed growing prefixes of the reply before the final.
    const streamed = await page.evaluate(() => window.__streamed);
    const partial = streamed.filter((t) => t.length > 0 && t.length < fakeReply(said).length);
    assert.ok(partial.length >= 2, `the streaming bubble showed at least two partial texts: ${JSON.stringify(streamed)}`);
    for (const t of partial) assert.ok(fakeReply(said).startsWith(t), `${JSON.stringify(t)} is a prefix of the reply`);
    assert.equal(await page.locator(".msg.streaming").count(), 0, "no bubble is left streaming");
    assert.deepEqual(await bubbleTexts(page, ".msg.user"), [said], "one user bubble with the message");
    await allConfirmed(page);

    // On the wire: chat.send, then deltas and one final for that run.
    const sendReq = frames.find((f) => f.dir === "out" && f.frame.method === "chat.send");
    assert.ok(sendReq, "the page sent chat.send");
    assert.equal(sendReq.frame.params.message, said);
    const runId = sendReq.frame.params.idempotencyKey;
    const chat = frames.filter((f) => f.dir === "in" && f.frame.event === "chat" && f.frame.payload.runId === runId);
    const deltas = chat.filter((f) => f.frame.payload.state === "delta");
    const finals = chat.filter((f) => f.frame.payload.state === "final");
    assert.ok(deltas.length >= 2, `several delta events (${deltas.length})`);
    assert.equal(finals.length, 1, "one final event");
    assert.equal(textOf(finals[0].frame.payload.message), fakeReply(said));
    for (const d of deltas) {
      const t = textOf(d.frame.payload.message);
      assert.ok(t && fakeReply(said).startsWith(t), `each delta carries a growing prefix of the reply: ${JSON.stringify(t)}`);
    }
    const persisted = frames.findIndex((f) => f.dir === "in" && f.frame.event === "session.message" && f.frame.payload.message.role === "assistant");
    assert.ok(persisted >= 0 && frames.indexOf(deltas[deltas.length - 1]) < persisted, "no delta comes after the persisted reply");

    // On disk: the user turn and the reply, once each, chained.
    const msgs = checkChain(readTranscript(gw.stateDir));
    const user = exactlyOnce(msgs, "user", said);
    assert.equal(user.idempotencyKey, `${runId}:user`);
    exactlyOnce(msgs, "assistant", fakeReply(said));
    assert.equal(msgs.length, 2, "nothing else was written");
    assert.deepEqual(errors, [], "no page errors");
  });

  test("a reload shows the same thread from history", async () => {
    const { page } = first;
    const before = { user: await bubbleTexts(page, ".msg.user"), bot: await bubbleTexts(page, ".msg.assistant") };
    await page.reload();
    await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
    await waitFor("the history after reload", async () => (await page.locator(".msg").count()) >= 2);
    assert.deepEqual(await bubbleTexts(page, ".msg.user"), before.user);
    assert.deepEqual(await bubbleTexts(page, ".msg.assistant"), before.bot);
    // Rendered from persisted entries (they carry their transcript entry ids).
    const ids = await page.$$eval(".msg", (els) => els.map((e) => e.dataset.entryId));
    const onDisk = readTranscript(gw.stateDir).slice(1).filter((e) => e.type === "message").map((e) => e.id);
    assert.deepEqual(ids, onDisk, "the page shows the transcript's entries, in order");
  });

  test("a second device sees the new turn and the reply live", async () => {
    const second = await openPage();
    await waitFor("history on the second page", async () => (await second.page.locator(".msg").count()) >= 2);
    const loadsBefore = second.frames.filter((f) => f.dir === "out" && f.frame.method === "chat.history").length;
    const said = "Second turn, watched from another device";
    await send(first.page, said);
    await waitForFinal(second.page, fakeReply(said));
    assert.deepEqual((await bubbleTexts(second.page, ".msg.user")).filter((t) => t === said), [said],
      "the second page shows the new user turn once");
    assert.deepEqual((await bubbleTexts(second.page, ".msg.assistant")).filter((t) => t === fakeReply(said)), [fakeReply(said)],
      "the second page shows the reply once");
    // Live, not by refetching: the second page received the events and did not reload history.
    const live = second.frames.filter((f) => f.dir === "in" && f.frame.event === "session.message").map((f) => textOf(f.frame.payload.message));
    assert.ok(live.includes(said) && live.includes(fakeReply(said)), `session.message events reached the second page: ${JSON.stringify(live)}`);
    const loadsAfter = second.frames.filter((f) => f.dir === "out" && f.frame.method === "chat.history").length;
    assert.equal(loadsAfter, loadsBefore, "the second page did not refetch the history");
    await waitForFinal(first.page, fakeReply(said));
    await allConfirmed(first.page);
    await allConfirmed(second.page);
    assert.deepEqual(second.errors, []);

    const msgs = checkChain(readTranscript(gw.stateDir));
    exactlyOnce(msgs, "user", said);
    exactlyOnce(msgs, "assistant", fakeReply(said));
    assert.equal(msgs.length, 4);
  });

  test("Stop ends a streaming reply and keeps the partial", async () => {
    const { page, frames } = first;
    const said = "Tell me a long story [slow]";
    await send(page, said);
    await waitFor("a few streamed words", async () => /word2 /.test((await page.locator(".msg.streaming").textContent({ timeout: 500 })) || ""));
    const stop = page.locator('[data-testid="stop"]');
    assert.equal(await stop.isEnabled(), true, "Stop is enabled while the reply streams");
    await stop.click();
    const aborted = page.locator(".msg.assistant.aborted");
    await aborted.waitFor({ timeout: 20000 });
    const [partial] = await bubbleTexts(page, ".msg.assistant.aborted");
    // The bubble's text is trimmed: a Stop that lands right after "word2 " keeps exactly "word0 word1 word2".
    assert.match(partial, /^word0 word1 word2(\s|$)/, "the partial starts as streamed");
    assert.ok(!partial.includes("word39"), "the reply was cut before its end");
    assert.match(await aborted.textContent(), /stopped/, "the bubble says it was stopped");
    await waitFor("Stop to be disabled again", async () => !(await stop.isEnabled()));
    assert.equal(await page.locator(".msg.streaming").count(), 0);
    await allConfirmed(page);

    const abortReq = frames.find((f) => f.dir === "out" && f.frame.method === "chat.abort");
    assert.ok(abortReq, "the page sent chat.abort");
    const abortedEv = frames.find((f) => f.dir === "in" && f.frame.event === "chat" && f.frame.payload.state === "aborted");
    assert.ok(abortedEv, "the gateway announced the abort");
    const persistedPartial = textOf(abortedEv.frame.payload.message);
    assert.equal(persistedPartial.trim(), partial, "the page shows the partial the gateway kept");

    const msgs = checkChain(readTranscript(gw.stateDir));
    exactlyOnce(msgs, "user", said);
    const kept = exactlyOnce(msgs, "assistant", persistedPartial);
    assert.equal(kept.openclawAbort?.aborted, true, "the kept partial is marked as aborted");
    assert.equal(msgs.length, 6);
    assert.ok(!msgs.some((m) => textOf(m).includes("word39")), "no full reply was written after the stop");

    await page.locator('[data-testid="composer"]').fill("");
    await page.screenshot({ path: SCREENSHOT });
  });
});
