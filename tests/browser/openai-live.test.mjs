// A WebChat page open on a session shows the turns an OpenAI-compatible client makes in it, live:
// the user row and the streaming reply appear while the API request is still running (the fake
// streams `[slow]` replies over seconds), the final equals what the API answered, and a second API
// turn that resends the whole history (no session header: matched by content) lands in the same
// session and the same page. The JSONL has each turn once, chained.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  TOKEN, checkChain, exactlyOnce, fakeReply, launchBrowser, readTranscript, startFakeProvider, startGateway, textOf,
  waitFor,
} from "./harness.mjs";

describe("the OpenAI-compatible endpoint seen from the WebChat", () => {
  let provider, gw, browser;

  before(async () => {
    provider = await startFakeProvider();
    gw = await startGateway(provider, "[gateway.openai_api]\nenabled = true\n");
    browser = await launchBrowser();
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  const complete = (messages, headers = {}) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json", ...headers },
      body: JSON.stringify({ model: "pincer", messages }),
    }).then(async (r) => ({ status: r.status, session: r.headers.get("x-pincer-session-key"), body: await r.json() }));

  test("API turns show up on the open page while they stream, and the resent history continues that session", async () => {
    const page = await browser.context.newPage();
    await page.goto(`${gw.url}/#token=${TOKEN}`);
    await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
    const bodies = (role) =>
      page.$$eval(`[data-testid="message"][data-role="${role}"]`, (els) => els.map((e) => (e.querySelector(".body") || e).textContent.trim()));

    const first = "from the API [slow]";
    let answered = false;
    const pending = complete([{ role: "user", content: first }], { "x-pincer-session-key": "main" })
      .then((r) => { answered = true; return r; });
    await waitFor("the API's user message on the page", async () => (await bodies("user")).includes(first));
    await waitFor("the reply streaming on the page", async () =>
      (await page.$$eval('[data-testid="streaming"]', (els) => els.map((e) => e.textContent.trim()))).some((t) => t.startsWith("word0")));
    assert.equal(answered, false, "the page showed the turn before the API request finished: live, not on reload");
    const r1 = await pending;
    assert.equal(r1.status, 200, JSON.stringify(r1.body));
    assert.equal(r1.session, "agent:main:main");
    const reply1 = r1.body.choices[0].message.content;
    assert.ok(reply1.startsWith("word0 ") && reply1.includes("word39"), reply1);
    await waitFor("the final reply on the page", async () => (await bodies("assistant")).includes(reply1.trim()));

    // Open WebUI's way: the whole history again, no session header.
    const second = "second API turn";
    const r2 = await complete([{ role: "user", content: first }, { role: "assistant", content: reply1 }, { role: "user", content: second }]);
    assert.equal(r2.status, 200, JSON.stringify(r2.body));
    assert.equal(r2.session, "agent:main:main", "matched by content to the open session");
    assert.equal(r2.body.choices[0].message.content, fakeReply(second));
    await waitFor("the second API turn on the page", async () =>
      (await bodies("user")).includes(second) && (await bodies("assistant")).includes(fakeReply(second)));

    const lines = readTranscript(gw.stateDir);
    checkChain(lines);
    const msgs = lines.filter((e) => e.type === "message").map((e) => e.message);
    exactlyOnce(msgs, "user", first);
    exactlyOnce(msgs, "user", second);
    assert.deepEqual(msgs.map((m) => [m.role, textOf(m).trim()]),
      [["user", first], ["assistant", reply1.trim()], ["user", second], ["assistant", fakeReply(second)]]);
    await page.close();
  });
});
