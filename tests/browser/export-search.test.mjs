// Export and search in a real browser. (1) The HTML export of a session with three branches, a
// compaction, a label, a tool call and images (crates/export/tests/fixtures/three-branches.jsonl,
// exported by `pincer transcript export`) opened from file:// with every network request refused:
// every branch reachable, deep links open the right entry on its branch, the "user messages only"
// filter, and the <script> and onerror planted in a message never run. (2) The WebChat on a state
// dir of 1,000 generated sessions (the testkit's `corpus` example) plus that session imported
// with `pincer transcript import`: the search box finds the planted words, opening a hit shows its
// session on the branch that holds it, scrolled to it, and the export button downloads the file.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { PINCER_BIN, REPO, TOKEN, launchBrowser, startFakeProvider, startGateway, waitFor } from "./harness.mjs";

const FIXTURE = path.join(REPO, "crates/export/tests/fixtures/three-branches.jsonl");
const CORPUS_BIN = process.env.PINCER_CORPUS || path.join(REPO, "target/debug/examples/corpus");

/** Entry ids shown in the export's thread, in order. */
const shownIds = (page) => page.$$eval("main.thread .entry", (els) => els.map((e) => e.dataset.entryId));

describe("HTML export from file:// without network", () => {
  let browser, dir, file;
  const refused = [];

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), "pincer-export-"));
    file = path.join(dir, "export.html");
    execFileSync(PINCER_BIN, ["transcript", "export", FIXTURE, "--format", "html", "--output", file]);
    browser = await launchBrowser();
    await browser.context.route("**/*", (route) => {
      const url = route.request().url();
      if (url.startsWith("file:")) return route.continue();
      refused.push(url);
      return route.abort();
    });
  });
  after(async () => {
    await browser?.close();
    if (dir) fs.rmSync(dir, { recursive: true, force: true });
  });

  async function open(hash = "") {
    const page = await browser.context.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(pathToFileURL(file).href + hash);
    await page.locator("body[data-ready=true]").waitFor({ timeout: 20000 });
    return { page, errors };
  }

  test("every branch is reachable, with its summaries, labels, tool calls and images", async () => {
    const { page, errors } = await open();
    const branches = page.locator('[data-testid="branch"]');
    assert.equal(await branches.count(), 3, "three tips: branches A, B and C");
    const headlines = await page.$$eval('[data-testid="branch"] .headline', (els) => els.map((e) => e.textContent));
    assert.deepEqual(headlines, ["Branch A answer: try pastéis de nata.", "Branch C answer: Pena Palace in Sintra.",
      "Branch B answer: Porto is lovely."], "each branch named by its last message, the active one first");
    // The file's leaf (moved by a `leaf` entry) is open first: branch A.
    assert.deepEqual(await shownIds(page), ["u1", "a1", "u2", "a2", "t2", "a2b", "c1", "u3", "a3"]);
    assert.equal(await page.locator('.entry[data-entry-id="c1"].compaction').count(), 1, "the compaction");
    assert.match(await page.locator('.entry[data-entry-id="c1"]').innerText(), /A trip to Lisbon/);
    assert.equal(await page.locator('.entry[data-entry-id="u2"] [data-testid="label"]').innerText(), "museums");
    assert.match(await page.locator('.entry[data-entry-id="a2"] [data-testid="tool-call"]').innerText(), /search[\s\S]*Lisbon museums/);
    assert.match(await page.locator('.entry[data-entry-id="a2b"] .md').innerHTML(), /<strong>Gulbenkian<\/strong>[\s\S]*<table>/, "Markdown rendered");
    const images = await page.$$eval("img.image", (imgs) => imgs.map((i) => [i.complete, i.naturalWidth]));
    assert.deepEqual(images, [[true, 1], [true, 1]], "the tool result's and the user's image, from data: URLs");
    const seen = {};
    for (let i = 0; i < 3; i++) {
      await branches.nth(i).click();
      const ids = await shownIds(page);
      seen[ids[ids.length - 1]] = ids;
    }
    assert.deepEqual(seen.a3, ["u1", "a1", "u2", "a2", "t2", "a2b", "c1", "u3", "a3"]);
    assert.deepEqual(seen.a4, ["u1", "a1", "u4", "a4"], "branch B (its tip is the label entry)");
    assert.deepEqual(seen.a5, ["u1", "a1", "bs1", "u5", "a5"], "branch C, after its branch summary");
    await page.locator('[data-testid="branch"][data-tip="a5"]').click();
    assert.match(await page.locator('.entry[data-entry-id="bs1"]').innerText(), /considered Porto/);
    assert.deepEqual(errors, []);
    assert.deepEqual(refused, [], "nothing was fetched");
    await page.close();
  });

  test("a deep link opens the entry on its branch; the user-only filter hides the rest", async () => {
    const { page, errors } = await open("#entry=a4");
    assert.deepEqual(await shownIds(page), ["u1", "a1", "u4", "a4"]);
    const target = page.locator('.entry.target[data-entry-id="a4"]');
    await target.waitFor();
    assert.ok(await target.isVisible());
    assert.match(await target.innerText(), /Porto is lovely/);
    await page.evaluate(() => { location.hash = "#entry=u5"; });
    await page.locator('.entry.target[data-entry-id="u5"]').waitFor();
    assert.deepEqual(await shownIds(page), ["u1", "a1", "bs1", "u5", "a5"]);
    assert.equal(await page.locator('[data-testid="branch"].current').getAttribute("data-tip"), "a5");
    await page.locator('[data-testid="user-only"]').check();
    const visible = await page.$$eval("main.thread .entry", (els) => els.filter((e) => e.offsetParent !== null).map((e) => e.dataset.entryId));
    assert.deepEqual(visible, ["u1", "u5"]);
    assert.deepEqual(errors, []);
    await page.close();
  });

  test("a <script> and an onerror handler in a message do not run", async () => {
    const { page, errors } = await open("#entry=u2");
    const u2 = page.locator('.entry[data-entry-id="u2"]');
    await u2.waitFor();
    assert.match(await u2.innerText(), /What about museums\?/);
    assert.equal(await page.locator("main.thread script").count(), 0);
    assert.equal(await page.locator("main.thread [onerror]").count(), 0);
    assert.equal(await page.evaluate(() => window.__injected), undefined);
    assert.deepEqual(errors, []);
    await page.close();
  });
});

describe("WebChat search over 1,000 sessions and export", () => {
  let provider, gw, browser, page, planted;
  const errors = [];

  before(async () => {
    assert.ok(fs.existsSync(CORPUS_BIN), `no corpus generator at ${CORPUS_BIN}: cargo build -p pincer-testkit --example corpus`);
    provider = await startFakeProvider();
    gw = await startGateway(provider);
    const out = execFileSync(CORPUS_BIN, [gw.stateDir, "1000", "100"], { maxBuffer: 1 << 24 }).toString();
    planted = out.trim().split("\n").map((l) => JSON.parse(l));
    execFileSync(PINCER_BIN, ["transcript", "import", FIXTURE, "--state-dir", gw.stateDir]);
    await gw.restart(); // the indexer takes in every transcript when it starts
    browser = await launchBrowser();
    page = await browser.context.newPage();
    page.on("pageerror", (e) => errors.push(e.message));
    await page.goto(`${gw.url}/#token=${TOKEN}`);
    await page.locator('[data-testid="status"].ok').waitFor({ timeout: 20000 });
  });
  after(async () => {
    await browser?.close();
    await gw?.stop();
    await provider?.close();
  });

  async function search(query) {
    // Until the gateway's first sync of the 100,000 generated entries is done, answers say so.
    await waitFor("the index to be complete", async () => {
      await searchOnce(query);
      return page.evaluate(() => document.querySelector('[data-testid="search-results"]').dataset.indexing === "false");
    }, 240000);
    return page.$$eval('[data-testid="search-hit"]', (els) => els.map((e) => `${e.dataset.key} ${e.dataset.entryId}`));
  }

  async function searchOnce(query) {
    await page.evaluate(() => { delete document.querySelector('[data-testid="search-results"]').dataset.query; });
    await page.locator('[data-testid="search-input"]').fill(query);
    await page.locator('[data-testid="search-input"]').press("Enter");
    // The results of this query (and these options), not the previous ones.
    const archived = await page.locator('[data-testid="search-archived"]').isChecked();
    await waitFor(`the results of ${query}`, () => page.evaluate(([q, archived]) => {
      const box = document.querySelector('[data-testid="search-results"]');
      return box.dataset.query === q && box.dataset.archived === String(archived) && !box.hidden;
    }, [query, archived]), 120000);
  }

  test("the planted words, phrase and prefix are found", async () => {
    const byQuery = new Map();
    for (const p of planted) {
      if (p.archived) continue;
      if (!byQuery.has(p.query)) byQuery.set(p.query, []);
      byQuery.get(p.query).push(`${p.sessionKey} ${p.entryId}`);
    }
    for (const q of ["needle3", "\"amber falcon sings\"", "quasar*"]) {
      assert.deepEqual((await search(q)).sort(), byQuery.get(q).sort(), q);
    }
    assert.deepEqual(await search("needlearchived"), [], "archived sessions only on request");
    await page.locator('[data-testid="search-archived"]').check();
    assert.equal((await search("needlearchived")).length, 1);
    await page.locator('[data-testid="search-archived"]').uncheck();
  });

  test("opening a hit shows the entry on its branch, not the active one", async () => {
    const side = planted.find((p) => p.query === "needlebranch");
    assert.ok(side.offBranch);
    assert.deepEqual(await search("needlebranch"), [`${side.sessionKey} ${side.entryId}`]);
    await page.locator('[data-testid="search-hit"]').first().click();
    const hit = page.locator(`#log .hit[data-entry-id="${side.entryId}"]`);
    await hit.waitFor({ timeout: 20000 });
    assert.ok(await hit.isVisible(), "scrolled into view");
    assert.match(await hit.innerText(), /needlebranch/);
    const n = side.entryId.match(/^e(\d+)x/)[1];
    assert.equal(await page.locator(`#log [data-entry-id="e${n}x31"]`).count(), 0, "the main chain past the fork is not shown");
    assert.equal(await page.locator(`#log [data-entry-id="e${n}x30"]`).count(), 1, "the fork point is");

    // The imported session: branch B's reply, while branch A is active.
    const hits = await search("\"Porto is lovely\"");
    assert.deepEqual(hits, ["agent:main:import:export-fixture a4"]);
    await page.locator('[data-testid="search-hit"]').first().click();
    await page.locator('#log .hit[data-entry-id="a4"]').waitFor({ timeout: 20000 });
    assert.equal(await page.locator('#log [data-entry-id="a3"]').count(), 0, "branch A is not shown");
    assert.deepEqual(errors, []);
  });

  test("the export button downloads the session's HTML export", async () => {
    const row = page.locator('[data-testid="session-row"][data-key="agent:main:import:export-fixture"]');
    await row.hover();
    await row.locator('[data-testid="row-menu"]').click();
    await row.locator('[data-testid="export"]').click();
    const [download] = await Promise.all([page.waitForEvent("download"), row.locator('[data-testid="export-html"]').click()]);
    const saved = await download.path();
    const html = fs.readFileSync(saved, "utf8");
    const b64 = html.match(/id="pincer-session"[^>]*>([^<]*)<\/script>/)[1].replace(/\s+/g, "");
    const onDisk = fs.readFileSync(path.join(gw.stateDir, "agents/main/sessions/export-fixture.jsonl"));
    assert.ok(Buffer.from(b64, "base64").equals(onDisk), "the transcript as it is on disk, moves of the leaf included");
    assert.match(download.suggestedFilename(), /^pincer-export-fixture\.html$/);
    await waitFor("no error banner", async () => page.locator('[data-testid="error"]').isHidden());
  });
});
