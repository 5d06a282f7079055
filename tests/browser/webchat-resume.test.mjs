// The WebChat when the gateway dies mid-reply (issue 38): after the restart the page never keeps a
// dead stream on screen. With attempts left, the gateway resumes the turn by itself and the page
// shows the resumed reply without a reload, its question marked "resumed"; with none
// (`resume_attempts = 0`), the cut bubble goes, Stop is off, the question is marked interrupted
// and offers Regenerate, which answers it (a reply under it: the markers go). Each checks the DOM and the transcript on disk.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { TOKEN, launchBrowser, readTranscript, startFakeProvider, startGateway, textOf, waitFor } from "./harness.mjs";

/** The fake provider's reply to a `[slow]` message: 40 words, 400 ms apart. */
const SLOW_REPLY = Array.from({ length: 40 }, (_, i) => `word${i}`).join(" ");

async function setup(agentDefaults) {
  const provider = await startFakeProvider();
  const gw = await startGateway(provider, "", { agentDefaults });
  const browser = await launchBrowser();
  const page = await browser.context.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${gw.url}/#token=${TOKEN}`);
  await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
  // Set once: still there at the end only if the page was never reloaded.
  await page.evaluate(() => { window.__sameDocument = true; });
  return { provider, gw, browser, page, errors };
}

async function teardown(t) {
  await t?.browser?.close();
  await t?.gw?.stop();
  await t?.provider?.close();
}

/** Sends `text`, waits for its reply to stream, then SIGKILLs the gateway and restarts it. */
async function killMidReply({ page, gw }, text) {
  await page.locator('[data-testid="composer"]').fill(text);
  await page.locator('[data-testid="send"]').click();
  const bubble = page.locator('[data-testid="streaming"]');
  await waitFor("the reply streaming", async () => /word2/.test(await bubble.textContent({ timeout: 500 })), 30000);
  await gw.kill();
  await page.locator('[data-testid="status"].bad').waitFor({ timeout: 20000 });
  await gw.restart();
  await page.locator('[data-testid="status"].ok').waitFor({ timeout: 30000 });
}

const userRows = (gw) => readTranscript(gw.stateDir).filter((e) => e.message?.role === "user");
const replies = (gw) => readTranscript(gw.stateDir).filter((e) => e.message?.role === "assistant");

describe("WebChat: a turn cut by a crash", () => {
  let t;
  before(async () => { t = await setup([]); });
  after(async () => teardown(t));

  test("resumed by the gateway: the reply appears without a reload, no dead stream, the question marked", async () => {
    const { page, gw, errors } = t;
    await killMidReply(t, "[slow] tell me everything");
    const reply = page.locator('[data-testid="message"][data-role="assistant"]');
    await waitFor("the resumed reply on the page", async () => (await reply.count()) === 1 && (await reply.first().locator(".body").textContent()).trim() === SLOW_REPLY, 60000);
    await waitFor("no stream left", async () => (await page.locator('[data-testid="streaming"]').count()) === 0);
    assert.equal(await page.evaluate(() => window.__sameDocument === true), true, "the page was not reloaded");
    const question = page.locator('[data-testid="message"][data-role="user"]');
    await question.locator('[data-testid="turn-resumed"]').waitFor({ timeout: 10000 });
    assert.equal(await question.locator('[data-testid="unanswered"]').count(), 0);
    assert.equal(await question.locator('[data-testid="regenerate"]').count(), 0, "an answered question offers no Regenerate");
    assert.equal(await page.locator('[data-testid="stop"]').isDisabled(), true, "Stop is off once the run ended");
    assert.equal(userRows(gw).length, 1);
    const own = replies(gw);
    assert.equal(own.length, 1, "exactly one reply on disk");
    assert.equal(textOf(own[0].message).trim(), SLOW_REPLY);
    assert.deepEqual(errors, []);
  });
});

describe("WebChat: a turn cut by a crash, out of attempts", () => {
  let t;
  before(async () => { t = await setup(["resume_attempts = 0"]); });
  after(async () => teardown(t));

  test("the cut bubble goes, Stop is off, the question is marked interrupted and Regenerate answers it", async () => {
    const { page, gw, errors } = t;
    await killMidReply(t, "[slow] the cut question");
    await waitFor("the dead stream gone", async () => (await page.locator('[data-testid="streaming"]').count()) === 0);
    const question = page.locator('[data-testid="message"][data-role="user"]');
    await question.locator('[data-testid="turn-interrupted"]').waitFor({ timeout: 20000 });
    assert.equal(await page.locator('[data-testid="stop"]').isDisabled(), true, "no run: Stop is off");
    assert.equal(await page.evaluate(() => window.__sameDocument === true), true, "the page was not reloaded");
    assert.equal(replies(gw).length, 0, "no reply on disk");
    const regenerate = question.locator('[data-testid="regenerate"]');
    await waitFor("Regenerate enabled", async () => !(await regenerate.isDisabled()));
    await regenerate.click();
    const reply = page.locator('[data-testid="message"][data-role="assistant"]');
    await waitFor("the answer", async () => (await reply.count()) === 1 && (await reply.first().locator(".body").textContent()).trim() === SLOW_REPLY, 60000);
    await waitFor("the markers gone", async () => (await question.locator('[data-testid="regenerate"]').count()) === 0 &&
      (await question.locator('[data-testid="turn-interrupted"]').count()) === 0);
    const [user] = userRows(gw);
    assert.equal(userRows(gw).length, 1, "no second user row");
    const own = replies(gw);
    assert.equal(own.length, 1);
    assert.equal(own[0].parentId, user.id, "the answer is a reply under the question");
    assert.deepEqual(errors, []);
  });
});
