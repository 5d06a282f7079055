// Shared setup of the browser tests: the Rust tests' fake OpenAI-compatible provider (a process),
// the real `pincer gateway` process on port 0 with a temp state dir, Debian's Chromium driven by
// playwright-core, and readers for the transcript JSONL that the gateway wrote to disk.
import { execFileSync, spawn } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
export const PINCER_BIN = process.env.PINCER_BIN || path.join(REPO, "target/debug/pincer");
export const CHROMIUM = process.env.PINCER_CHROMIUM || "/usr/bin/chromium";
export const TOKEN = "browser-test-token-0123456789";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The reply the fake provider streams for a user message (without `[slow]`). */
export function fakeReply(said) {
  return `Fake reply: you said "${said}"`;
}

/** The testkit's fake provider binary (`cargo build -p pincer-testkit --example fake_provider`). */
export const FAKE_PROVIDER_BIN = process.env.PINCER_FAKE_PROVIDER || path.join(REPO, "target/debug/examples/fake_provider");

/**
 * Starts the Rust tests' fake provider (crates/testkit, `fake_openai`) as a process on 127.0.0.1:0.
 * POST /v1/chat/completions answers with an SSE stream in OpenAI's framing: a role chunk, content
 * deltas 40 ms apart, a finish chunk, a usage chunk, `data: [DONE]`. A message containing `[slow]`
 * streams 40 chunks ("word0 " …) 400 ms apart (16 s: time for a loaded machine to show Stop) and stops early when the client hangs up (that is
 * what an abort looks like from there). The process prints each request body as a JSON line;
 * `requests` collects them in arrival order.
 */
export async function startFakeProvider() {
  assert.ok(fs.existsSync(FAKE_PROVIDER_BIN),
    `no fake provider at ${FAKE_PROVIDER_BIN}: run cargo build -p pincer-testkit --example fake_provider or set PINCER_FAKE_PROVIDER`);
  const child = spawn(FAKE_PROVIDER_BIN, ["--word-ms", "40", "--slow-ms", "400"], { stdio: ["pipe", "pipe", "inherit"] });
  const requests = [];
  const lines = readline.createInterface({ input: child.stdout });
  const first = new Promise((resolve, reject) => {
    child.once("exit", (code) => reject(new Error(`the fake provider exited (${code}) before it listened`)));
    lines.once("line", resolve);
  });
  const { baseUrl } = JSON.parse(await first);
  lines.on("line", (line) => {
    try { requests.push(JSON.parse(line)); } catch { requests.push({}); }
  });
  return {
    baseUrl,
    requests,
    close: async () => {
      child.stdin.end(); // it exits when stdin closes
      if (child.exitCode === null) await once(child, "exit");
    },
  };
}

/**
 * The pinned OpenClaw Control UI's static files (`PINCER_CONTROL_UI_DIR`, else
 * `target/control-ui/<package>`), fetched by `fetch-control-ui.mjs` when missing. A gateway serves
 * them with `[gateway] control_ui_dir` set to this directory.
 */
export function controlUiDir() {
  const here = path.join(REPO, "tests/browser");
  const pin = JSON.parse(fs.readFileSync(path.join(here, "package.json"), "utf8")).pincerControlUi.package;
  const dir = process.env.PINCER_CONTROL_UI_DIR ||
    path.join(REPO, "target/control-ui", pin.replace("@", "-").replace("/", "-"));
  if (!fs.existsSync(path.join(dir, "index.html"))) {
    execFileSync(process.execPath, [path.join(here, "fetch-control-ui.mjs"), dir], { stdio: "inherit" });
  }
  return dir;
}

/**
 * Starts `pincer gateway --bind 127.0.0.1:0` with a fresh state dir whose pincer.toml points at the
 * fake provider (plus `extraToml`, and `agentDefaults` lines in its `[agents.defaults]`), and waits for
 * `listening on ws://127.0.0.1:PORT` on stderr.
 */
export async function startGateway(provider, extraToml = "", { extraModels = [], agentDefaults = [] } = {}) {
  assert.ok(fs.existsSync(PINCER_BIN), `no pincer binary at ${PINCER_BIN}: run cargo build -p pincer or set PINCER_BIN`);
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "pincer-browser-"));
  const stateDir = path.join(root, "state");
  fs.mkdirSync(stateDir, { recursive: true });
  const toml = [
    extraToml,
    "[models.providers.fake]",
    'api = "openai-completions"',
    `base_url = "${provider.baseUrl}"`,
    'api_key = "test-key"',
    "[[models.providers.fake.models]]",
    'id = "fake-model"',
    "context_window = 32000",
    ...extraModels.flatMap((id) => ["[[models.providers.fake.models]]", `id = "${id}"`, "context_window = 32000"]),
    "[agents.defaults]",
    'model = "fake/fake-model"',
    ...agentDefaults,
    "",
  ].join("\n");
  fs.writeFileSync(path.join(stateDir, "pincer.toml"), toml);
  const gw = await spawnGateway(stateDir, "127.0.0.1:0");
  gw.root = root;
  return gw;
}

/** The environment the gateway runs with: the test token, no provider keys from the outside. */
export function gatewayEnv() {
  const env = { ...process.env, PINCER_GATEWAY_TOKEN: TOKEN, PINCER_LOG: "info" };
  for (const k of ["OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "PINCER_MODEL", "PINCER_STATE_DIR"]) delete env[k];
  return env;
}

/**
 * Runs `pincer gateway` on `stateDir` and `bind`; `kill()` ends it with SIGKILL (a crash), `restart()`
 * starts it again on the same port and state, and `stop()` ends it and removes the test's folder.
 */
async function spawnGateway(stateDir, bind) {
  const env = gatewayEnv();
  const child = spawn(PINCER_BIN, ["gateway", "--bind", bind, "--state-dir", stateDir],
    { env, stdio: ["ignore", "ignore", "pipe"] });
  const log = [];
  let exited = null;
  child.on("exit", (code, sig) => { exited = { code, sig }; });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the gateway did not start within 30 s:\n${log.join("\n")}`)), 30000);
    let buf = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (d) => {
      buf += d;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 1);
        log.push(line);
        const m = line.match(/listening on ws:\/\/127\.0\.0\.1:(\d+)/);
        if (m) { clearTimeout(timer); resolve(Number(m[1])); }
      }
    });
    child.on("exit", (code) => { clearTimeout(timer); reject(new Error(`the gateway exited (${code}) before listening:\n${log.join("\n")}`)); });
  });
  const gw = {
    port, stateDir, root: null, log, child,
    url: `http://127.0.0.1:${port}`,
    async kill() {
      if (exited === null) { child.kill("SIGKILL"); await once(child, "exit").catch(() => {}); }
    },
    // Always this object's: after a restart `kill` and `stop` act on the new process.
    async restart() {
      await gw.kill();
      const next = await spawnGateway(stateDir, `127.0.0.1:${port}`);
      Object.assign(gw, {
        child: next.child, log: next.log, kill: next.kill,
        stop: async () => { await next.stop(); if (gw.root) fs.rmSync(gw.root, { recursive: true, force: true }); },
      });
      return gw;
    },
    async stop() {
      if (exited === null) {
        child.kill("SIGTERM");
        const t = setTimeout(() => child.kill("SIGKILL"), 10000);
        await once(child, "exit").catch(() => {});
        clearTimeout(t);
      }
      if (gw.root) fs.rmSync(gw.root, { recursive: true, force: true });
    },
  };
  return gw;
}

/** Launches Debian's Chromium headless with a fresh user-data-dir (never a downloaded browser). */
export async function launchBrowser() {
  assert.ok(fs.existsSync(CHROMIUM), `no Chromium at ${CHROMIUM}: apt-get install -y chromium`);
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "pincer-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    viewport: { width: 1100, height: 760 },
  });
  return {
    context,
    async close() {
      await context.close().catch(() => {});
      fs.rmSync(userDataDir, { recursive: true, force: true });
    },
  };
}

/**
 * Records the WebSocket frames of a page (both directions, parsed JSON, `sock` numbering the page's
 * sockets in the order they opened) so tests can assert on the wire as well as on the DOM.
 */
export function recordFrames(page) {
  const frames = [];
  let sockets = 0;
  page.on("websocket", (ws) => {
    const sock = ++sockets;
    const push = (dir) => (ev) => {
      const data = typeof ev.payload === "string" ? ev.payload : ev.payload.toString("utf8");
      try { frames.push({ dir, url: ws.url(), sock, t: Date.now(), frame: JSON.parse(data) }); } catch { /* not JSON */ }
    };
    ws.on("framesent", push("out"));
    ws.on("framereceived", push("in"));
  });
  return frames;
}

/** Polls `fn` until it returns a truthy value (generous default: 20 s); throws with `what` otherwise. */
export async function waitFor(what, fn, timeoutMs = 20000) {
  const end = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try { last = await fn(); } catch (e) { last = e; }
    if (last && !(last instanceof Error)) return last;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}${last instanceof Error ? `: ${last.message}` : ""}`);
    await sleep(100);
  }
}

/** The text of a transcript message (string content or text blocks). */
export function textOf(msg) {
  if (!msg) return "";
  if (typeof msg.content === "string") return msg.content;
  if (Array.isArray(msg.content)) return msg.content.filter((b) => b.type === "text").map((b) => b.text).join("");
  return "";
}

/** The lines of the main session's transcript: sessions.json → sessionId → `<sessionId>.jsonl`. */
export function readTranscript(stateDir, sessionKey = "agent:main:main") {
  const dir = path.join(stateDir, "agents/main/sessions");
  const index = JSON.parse(fs.readFileSync(path.join(dir, "sessions.json"), "utf8"));
  const entry = index[sessionKey];
  assert.ok(entry && entry.sessionId, `sessions.json has no ${sessionKey}: ${JSON.stringify(index)}`);
  const file = path.join(dir, `${entry.sessionId}.jsonl`);
  const raw = fs.readFileSync(file, "utf8");
  assert.ok(raw.endsWith("\n"), "the transcript ends with a newline (no torn tail)");
  return raw.trimEnd().split("\n").map((l) => JSON.parse(l));
}

/**
 * Checks the transcript's shape — a session header, then entries with unique ids, each chained to
 * the one before by parentId (one linear branch, as these scenarios never branch) — and returns its
 * message entries.
 */
export function checkChain(lines) {
  assert.equal(lines[0].type, "session", "the first line is the session header");
  const entries = lines.slice(1);
  const ids = new Set();
  let prev = null;
  for (const e of entries) {
    assert.ok(e.id, `entry without id: ${JSON.stringify(e)}`);
    assert.ok(!ids.has(e.id), `duplicate id ${e.id}`);
    ids.add(e.id);
    assert.equal(e.parentId ?? null, prev, `entry ${e.id} (${e.type}) is chained to the entry before it`);
    prev = e.id;
  }
  return entries.filter((e) => e.type === "message").map((e) => e.message);
}

/** Asserts that exactly one message of `role` has exactly `text`, and returns it. */
export function exactlyOnce(messages, role, text) {
  const hits = messages.filter((m) => m.role === role && textOf(m) === text);
  assert.equal(hits.length, 1, `exactly one ${role} message ${JSON.stringify(text)} in the transcript; roles/texts: ` +
    JSON.stringify(messages.map((m) => [m.role, textOf(m).slice(0, 60)])));
  return hits[0];
}
