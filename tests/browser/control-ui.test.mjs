// Real-browser end to end test of OpenClaw's own Control UI (the unmodified static dist/control-ui/
// of the pinned openclaw package) against the real `pincer gateway`, which serves it under /control/
// (`[gateway] control_ui_dir`): connect with the token, send with Enter, stream, final, Stop, reload.
// Asserts on the WebSocket frames, on the DOM, and on the transcript JSONL on disk.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  REPO, TOKEN, checkChain, exactlyOnce, fakeReply, launchBrowser, readTranscript, recordFrames, startFakeProvider,
  startGateway, textOf, waitFor, controlUiDir } from "./harness.mjs";

const UI_DIR = controlUiDir();
const SCREENSHOT = process.env.PINCER_CONTROL_UI_SCREENSHOT || "/tmp/pincer-control-ui.png";
const SLOW = 45000; // the UI needs several seconds to settle (failed optional calls, polling)

/** The fake provider, a gateway serving the Control UI, and a browser page recording its frames. */
async function openControlUi() {
  const provider = await startFakeProvider();
  const gw = await startGateway(provider, `[gateway]\ncontrol_ui_dir = ${JSON.stringify(UI_DIR)}\n`);
  const browser = await launchBrowser();
  const page = await browser.context.newPage();
  return { provider, gw, browser, page, frames: recordFrames(page) };
}

describe("OpenClaw Control UI against Pincer", () => {
  let provider, gw, browser, page, frames;
  const pageErrors = [];

  before(async () => {
    ({ provider, gw, browser, page, frames } = await openControlUi());
    page.on("pageerror", (e) => pageErrors.push(e.message));
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  const out = (method) => frames.filter((f) => f.dir === "out" && f.frame.type === "req" && f.frame.method === method);
  const resTo = (req) => frames.find((f) => f.dir === "in" && f.frame.type === "res" && f.frame.id === req.frame.id);
  const chatEvents = (runId) =>
    frames.filter((f) => f.dir === "in" && f.frame.event === "chat" && f.frame.payload.runId === runId).map((f) => f.frame.payload);
  const composer = () => page.locator('textarea[aria-label="Chat composer"]');

  /** Waits for the hello-ok that answers the `n`-th connect of the page. */
  async function helloOk(n) {
    return waitFor(`hello-ok #${n}`, () => {
      const connects = out("connect");
      const res = connects[n - 1] && resTo(connects[n - 1]);
      return res && res.frame.ok && res.frame.payload.type === "hello-ok" ? { connect: connects[n - 1].frame, hello: res.frame.payload } : null;
    }, SLOW);
  }

  /** Sends `text` with Enter and returns the run id the gateway gave it. */
  async function sendWithEnter(text) {
    const before = out("chat.send").length;
    await composer().fill(text);
    await composer().press("Enter");
    const req = await waitFor(`chat.send of ${JSON.stringify(text)}`, () => out("chat.send")[before], SLOW);
    assert.equal(req.frame.params.message, text);
    assert.equal(req.frame.params.sessionKey, "agent:main:main");
    const res = await waitFor("the chat.send answer", () => resTo(req), SLOW);
    assert.equal(res.frame.ok, true, JSON.stringify(res.frame.error));
    assert.equal(res.frame.payload.status, "started");
    return res.frame.payload.runId;
  }

  test("loads from /control/, connects with the token and gets the chat surface it needs", async () => {
    await page.goto(`${gw.url}/control/#token=${TOKEN}`);
    const { connect, hello } = await helloOk(1);
    assert.equal(connect.params.auth.token, TOKEN, "the UI sent the token from the URL fragment");
    assert.ok(frames[0].url.startsWith(`ws://127.0.0.1:${gw.port}/`), `the UI found the gateway on its own origin: ${frames[0].url}`);
    for (const m of ["chat.startup", "chat.history", "chat.send", "chat.abort"]) {
      assert.ok(hello.features.methods.includes(m), `hello-ok advertises ${m}`);
    }
    assert.ok(hello.auth.scopes.includes("operator.write"), "operator.write is granted (the Stop button needs it)");
    const startup = await waitFor("chat.startup", () => out("chat.startup")[0], SLOW);
    const startupRes = await waitFor("the chat.startup answer", () => resTo(startup), SLOW);
    assert.equal(startupRes.frame.ok, true, JSON.stringify(startupRes.frame.error));
    await composer().waitFor({ state: "visible", timeout: SLOW });
    assert.ok(!page.url().includes(TOKEN), "the token was taken out of the address bar");
  });

  let first;
  test("Enter sends; the reply streams on the wire and the final shows on the page", async () => {
    const said = "Hello from the Control UI";
    const runId = await sendWithEnter(said);
    await page.getByText(fakeReply(said), { exact: true }).first().waitFor({ timeout: SLOW });
    const evs = chatEvents(runId);
    const deltas = evs.filter((e) => e.state === "delta");
    const finals = evs.filter((e) => e.state === "final");
    assert.ok(deltas.length >= 2, `several chat deltas (${deltas.length})`);
    assert.ok(deltas.some((d) => textOf(d.message) && textOf(d.message) !== fakeReply(said)), "a delta carried a partial reply");
    assert.equal(finals.length, 1, "one final");
    assert.equal(textOf(finals[0].message), fakeReply(said));
    assert.equal(await page.getByText(said, { exact: true }).count(), 1, "the user turn shows once");
    assert.equal(await page.getByText(fakeReply(said), { exact: true }).count(), 1, "the reply shows once");

    const msgs = checkChain(readTranscript(gw.stateDir));
    assert.equal(exactlyOnce(msgs, "user", said).idempotencyKey, `${runId}:user`);
    exactlyOnce(msgs, "assistant", fakeReply(said));
    assert.equal(msgs.length, 2);
    first = { said, runId };
  });

  test("Stop generating stops a streaming run; the partial is kept", async () => {
    assert.ok(first, "the first turn went through");
    const said = "Now a long one [slow]";
    const runId = await sendWithEnter(said);
    // The reply streams in the page, word by word.
    await page.getByText(/word3 /).first().waitFor({ timeout: SLOW });
    // The UI takes a session.message without `hasActiveRun: true` for the end of the run and hides
    // Stop while the reply still streams: the user row of a running turn must say it runs.
    const userRow = frames.find((f) => f.dir === "in" && f.frame.event === "session.message" &&
      f.frame.payload.message?.idempotencyKey === `${runId}:user`);
    assert.ok(userRow, "the user row was announced");
    assert.equal(userRow.frame.payload.hasActiveRun, true, "the user row's session.message says the session runs");
    assert.ok(userRow.frame.payload.activeRunIds.includes(runId));
    const stop = page.locator('button[aria-label="Stop generating"]');
    await stop.waitFor({ state: "visible", timeout: SLOW });
    // Stop comes with the run's start, from the run state the `sessions.changed` start event
    // carries (as OpenClaw's gateway sends it), not after the UI's next look at the session list
    // (that took ~5 s: a dozen of the fake's words, 0.4 s apart).
    const words = chatEvents(runId).filter((e) => e.state === "delta").length;
    assert.ok(words <= 8, `Stop showed only after ${words} words of the reply had streamed`);
    const started = frames.find((f) => f.dir === "in" && f.frame.event === "sessions.changed" && f.frame.payload.runId === runId && f.frame.payload.phase === "start");
    assert.equal(started?.frame.payload.hasActiveRun, true, JSON.stringify(started?.frame));
    const ended = () => chatEvents(runId).filter((e) => ["final", "aborted", "error"].includes(e.state));
    assert.equal(ended().length, 0, `Stop is shown while the reply streams: ${JSON.stringify(ended()).slice(0, 600)}`);
    // OpenClaw's startup phases came before the reply, and the UI took them without complaint.
    assert.deepEqual(chatEvents(runId).filter((e) => e.state === "status").map((e) => e.phase), ["preparing_context", "starting_model"]);
    await stop.click();

    const clickedAt = Date.now();
    const aborted = await waitFor("the aborted chat event", () => chatEvents(runId).find((e) => e.state === "aborted"), SLOW)
      .catch((e) => {
        const trace = frames.filter((f) => f.t >= clickedAt - 3000 && f.frame.event !== "tick")
          .map((f) => `${f.t - clickedAt} ${f.dir} ${JSON.stringify(f.frame).slice(0, 160)}`);
        throw new Error(`${e.message}; frames around the click:\n${trace.join("\n")}`);
      });
    const abortReq = [...out("chat.abort"), ...out("sessions.abort")];
    assert.equal(abortReq.length, 1, `one abort request: ${JSON.stringify(abortReq.map((f) => f.frame))}`);
    const abortRes = await waitFor("the abort answer", () => resTo(abortReq[0]), SLOW);
    assert.equal(abortRes.frame.ok, true, JSON.stringify(abortRes.frame.error));
    const partial = textOf(aborted.message);
    assert.match(partial, /^word0 word1 word2 word3 /, "the partial is what streamed");
    assert.ok(!partial.includes("word39"), "the run was cut before its end");
    assert.equal(chatEvents(runId).filter((e) => e.state === "final").length, 0, "no final after the stop");
    await stop.waitFor({ state: "hidden", timeout: SLOW });
    await page.getByText(partial.trim()).first().waitFor({ timeout: SLOW });

    const msgs = checkChain(readTranscript(gw.stateDir));
    exactlyOnce(msgs, "user", said);
    const kept = exactlyOnce(msgs, "assistant", partial);
    assert.equal(kept.openclawAbort?.aborted, true);
    assert.equal(msgs.length, 4);
  });

  test("a reload shows the thread from history", async () => {
    assert.ok(first, "the first turn went through");
    const connects = out("connect").length;
    await page.reload();
    await helloOk(connects + 1);
    await page.getByText(fakeReply(first.said), { exact: true }).first().waitFor({ timeout: SLOW });
    // The header shows the session's derived title (sessions.list includeDerivedTitles), which is
    // this first message: count it in the thread only.
    const inThread = (t) => page.getByText(t, { exact: true }).evaluateAll((els) => els.filter((e) => !e.closest(".chat-pane__session-title")).length);
    assert.equal(await inThread(first.said), 1, "the first user turn shows once");
    assert.equal(await page.getByText(fakeReply(first.said), { exact: true }).count(), 1, "the first reply shows once");
    await page.getByText("Now a long one [slow]", { exact: true }).waitFor({ timeout: SLOW });
    await page.getByText(/^word0 word1 word2 word3 /).first().waitFor({ timeout: SLOW });
    await page.screenshot({ path: SCREENSHOT });
    assert.deepEqual(pageErrors, [], "no uncaught errors in the page");
  });

  // OpenClaw 2026.9.6's tree methods, called as its Control UI calls them (control-ui-core: the
  // `Gs(sessionKey, agentId)` params, then `leafEntryId` for the switch), from the UI's own origin,
  // with the answers checked against the package's TypeBox schemas (dist/sessions-*.mjs):
  // SessionsBranchesListResultSchema = closedObject({branches: [SessionBranchSchema]}),
  // SessionBranchSchema = closedObject({leafEntryId: NonEmptyString, headline: String,
  // messageCount: Integer >= 0, updatedAt?: NonEmptyString, active: Boolean}),
  // SessionsBranchesSwitchResultSchema = closedObject({}).
  function checkClosed(obj, fields, where) {
    assert.equal(typeof obj, "object", `${where} is an object`);
    for (const k of Object.keys(obj)) assert.ok(k in fields, `${where}: unexpected property ${k} (closed object)`);
    for (const [k, [type, optional]] of Object.entries(fields)) {
      if (!(k in obj)) { assert.ok(optional, `${where}: ${k} is required`); continue; }
      const v = obj[k];
      if (type === "nonEmpty") assert.ok(typeof v === "string" && v.length > 0, `${where}.${k} is a non-empty string`);
      if (type === "string") assert.equal(typeof v, "string", `${where}.${k} is a string`);
      if (type === "uint") assert.ok(Number.isInteger(v) && v >= 0, `${where}.${k} is an integer >= 0`);
      if (type === "bool") assert.equal(typeof v, "boolean", `${where}.${k} is a boolean`);
      if (type === "array") assert.ok(Array.isArray(v), `${where}.${k} is an array`);
    }
  }
  const BRANCH = { leafEntryId: ["nonEmpty"], headline: ["string"], messageCount: ["uint"], updatedAt: ["nonEmpty", true], active: ["bool"] };

  test("sessions.branches.list and sessions.branches.switch answer the Control UI's calls in its schema's shape", async () => {
    const key = "agent:main:main";
    const call = (method, params) => page.evaluate(async ({ method, params, token }) => {
      const ws = new WebSocket(`ws://${location.host}/`);
      const frames = [];
      const answer = new Promise((resolve, reject) => {
        ws.onmessage = (e) => {
          const f = JSON.parse(e.data);
          if (f.event === "connect.challenge") {
            ws.send(JSON.stringify({ type: "req", id: "c", method: "connect", params: { minProtocol: 3, maxProtocol: 4,
              client: { id: "openclaw-control-ui", version: "test", platform: "web", mode: "webchat" },
              role: "operator", scopes: ["operator.read", "operator.write"], auth: { token } } }));
          } else if (f.type === "res" && f.id === "c") {
            ws.send(JSON.stringify({ type: "req", id: "m", method, params }));
          } else if (f.type === "res" && f.id === "m") resolve(f);
          frames.push(f);
        };
        ws.onerror = () => reject(new Error("socket error"));
      });
      const res = await answer;
      ws.close();
      return res;
    }, { method, params, token: TOKEN });

    // The UI asks on its own when it opens the chat: its answers were well-formed too.
    const own = out("sessions.branches.list");
    assert.ok(own.length >= 1, "the Control UI called sessions.branches.list");
    for (const req of own) {
      const res = resTo(req);
      assert.equal(res?.frame.ok, true, JSON.stringify(res?.frame));
      checkClosed(res.frame.payload, { branches: ["array"] }, "SessionsBranchesListResult");
      res.frame.payload.branches.forEach((b, i) => checkClosed(b, BRANCH, `branches[${i}]`));
    }
    const list = await call("sessions.branches.list", { sessionKey: key });
    assert.equal(list.ok, true, JSON.stringify(list));
    checkClosed(list.payload, { branches: ["array"] }, "SessionsBranchesListResult");
    list.payload.branches.forEach((b, i) => checkClosed(b, BRANCH, `branches[${i}]`));
    assert.equal(list.payload.branches.filter((b) => b.active).length, 1, "one active branch");

    // Make a second branch on disk (a sibling reply, as the WebChat's regenerate does), then switch.
    const lines = readTranscript(gw.stateDir);
    const user = lines.filter((e) => e.type === "message" && e.message.role === "user").at(-1);
    const regen = await call("chat.send", { sessionKey: key, message: "", idempotencyKey: "control-ui-regen", regenerateEntryId: user.id });
    assert.equal(regen.ok, true, JSON.stringify(regen));
    await waitFor("the sibling reply", () => readTranscript(gw.stateDir).filter((e) => e.type === "message" && e.parentId === user.id).length === 2);
    const two = await call("sessions.branches.list", { sessionKey: key });
    two.payload.branches.forEach((b, i) => checkClosed(b, BRANCH, `branches[${i}]`));
    const other = two.payload.branches.find((b) => !b.active);
    assert.ok(other, `an inactive branch: ${JSON.stringify(two.payload)}`);
    const sw = await call("sessions.branches.switch", { sessionKey: key, leafEntryId: other.leafEntryId });
    assert.equal(sw.ok, true, JSON.stringify(sw));
    checkClosed(sw.payload, {}, "SessionsBranchesSwitchResult");
    const after = await call("sessions.branches.list", { sessionKey: key });
    assert.equal(after.payload.branches.find((b) => b.active).leafEntryId, other.leafEntryId, "the switch took");
    assert.equal(readTranscript(gw.stateDir).at(-1).targetId, other.leafEntryId, "written as a leaf entry");
    const bad = await call("sessions.branches.switch", { sessionKey: key, leafEntryId: "no-such-entry" });
    assert.equal(bad.ok, false);
    assert.equal(bad.error.code, "INVALID_REQUEST");
    assert.equal(bad.error.message, "branch entry not found: no-such-entry (not in session agent:main:main)");
  });
});

// A tour of the Control UI's main views: each view's own calls are answered, and over the whole tour
// Pincer answers no request of the UI with an error (the frames on the wire), and no error banner shows.
describe("OpenClaw Control UI's views against Pincer", () => {
  let provider, gw, browser, page, frames;
  const VIEWS = [
    // [route, a method the view calls when it opens]
    ["chat", "chat.startup"], ["sessions", "sessions.list"], ["usage", "sessions.usage"], ["logs", "logs.tail"],
    ["settings", "config.get"], ["agents", "agents.list"], ["cron", "cron.list"], ["skills", "skills.status"],
    ["channels", "channels.status"], ["tasks", "tasks.list"], ["debug", "status"],
  ];

  before(async () => {
    ({ provider, gw, browser, page, frames } = await openControlUi());
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  const answered = (method) => {
    const reqs = frames.filter((f) => f.dir === "out" && f.frame.type === "req" && f.frame.method === method);
    return reqs.some((r) => frames.some((f) => f.dir === "in" && f.frame.type === "res" && f.frame.id === r.frame.id));
  };

  test("every main view opens and Pincer answers none of the UI's requests with an error", async () => {
    for (const [i, [route, method]] of VIEWS.entries()) {
      await page.goto(`${gw.url}/control/${route}#token=${TOKEN}`);
      await waitFor(`the ${route} view's ${method}`, () => answered(method), SLOW);
      await page.screenshot({ path: `/tmp/pincer-control-ui-tour-${i}-${route}.png` });
    }
    const requests = frames.filter((f) => f.dir === "out" && f.frame.type === "req");
    const byId = new Map(requests.map((f) => [f.frame.id, f.frame.method]));
    // The UI's client sends as soon as its socket is open, so a view opening while the socket is
    // new can put a request before `connect`. The protocol answers that with "the first request
    // must be connect" and a close (OpenClaw's own gateway does the same), and the UI reconnects:
    // those answers are the UI's race, not errors of Pincer's, and are checked to be just that.
    const connected = new Set();
    const beforeConnect = new Set();
    for (const f of requests) {
      if (f.frame.method === "connect") connected.add(f.sock);
      else if (!connected.has(f.sock)) beforeConnect.add(f.frame.id);
    }
    const failed = frames.filter((f) => f.dir === "in" && f.frame.type === "res" && f.frame.ok === false);
    for (const f of failed.filter((f) => beforeConnect.has(f.frame.id))) {
      assert.equal(f.frame.error?.message, "the first request must be connect", JSON.stringify(f.frame));
    }
    const errors = failed.filter((f) => !beforeConnect.has(f.frame.id))
      .map((f) => `${byId.get(f.frame.id)}: ${f.frame.error?.message}`);
    assert.deepEqual([...new Set(errors)], [], "error responses over the tour");
  });
});
