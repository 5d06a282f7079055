// The WebChat's entry point: wires the connection, the sidebar, the message list, the outbox and
// the composer together, and keeps the page in step with the gateway's events (a run's deltas,
// persisted messages, branch switches and session changes from other devices), searches across
// chats (opening a hit on the branch that holds it, however far back), downloads exports, keeps an
// address per chat (#chat=KEY: bookmarks, Back/Forward, new tabs) and the keyboard shortcuts.
import { Gateway } from "/webchat/js/rpc.js";
import { Outbox } from "/webchat/js/outbox.js";
import { Composer, setLimits } from "/webchat/js/composer.js";
import { MessageView } from "/webchat/js/messages.js";
import { Sidebar, titleOf, chatHref } from "/webchat/js/sessions.js";
import { Approvals } from "/webchat/js/approvals.js";
import { $, el, store, textOf, uuid } from "/webchat/js/util.js";

const MAIN = "agent:main:main";
/** Messages per chat.history window (the newest on opening a chat, then each older one). */
const WINDOW = 200;
/** The chat named by the address (#chat=KEY), if any. */
function keyFromUrl() {
  const m = location.hash.match(/(?:^#|&)chat=([^&]+)/);
  try { return m ? decodeURIComponent(m[1]) : null; } catch { return null; }
}
const state = {
  sessionKey: keyFromUrl() || store.get("pincer.session", MAIN),
  subscribed: null, runs: new Set(), info: null, models: null, viewing: null, refreshWanted: false, authFailed: false,
};

// ---- banners, status, theme, drawer -------------------------------------------------------------
let retryFn = null;
function showError(text, retry) {
  $("error-text").textContent = text || "";
  $("error").hidden = !text;
  retryFn = retry || null;
  $("error-retry").hidden = !retry;
}
$("error-close").addEventListener("click", () => showError(""));
$("error-retry").addEventListener("click", () => { const f = retryFn; showError(""); if (f) f(); });
function showNotice(text) { $("notice").textContent = text || ""; $("notice").hidden = !text; }
function setStatus(text, ok) { const s = $("status"); s.textContent = text; s.className = ok === undefined ? "" : ok ? "ok" : "bad"; s.title = text; }

/** Runs an action; a failure becomes a dismissible error with Retry. A lost connection is not an
 *  error of its own: the status says it, and the page catches up when it is back. */
async function attempt(what, fn) {
  try { return await fn(); } catch (e) {
    if (e.transport) setStatus("disconnected — reconnecting…", false);
    else showError(`${what}: ${e.message}`, () => attempt(what, fn));
    return undefined;
  }
}

const THEMES = ["system", "light", "dark"];
function applyTheme(t) {
  if (t === "system") delete document.documentElement.dataset.theme; else document.documentElement.dataset.theme = t;
  $("hljs-light").media = t === "system" ? "(prefers-color-scheme: light)" : t === "light" ? "all" : "not all";
  $("hljs-dark").media = t === "system" ? "(prefers-color-scheme: dark)" : t === "dark" ? "all" : "not all";
  $("theme").setAttribute("aria-label", `Colour theme: ${t} (change)`);
  $("theme").title = `Theme: ${t}`;
  $("theme").textContent = t === "light" ? "☀" : t === "dark" ? "☾" : "◐";
}
let theme = store.get("pincer.theme", "system");
applyTheme(theme);
$("theme").addEventListener("click", () => { theme = THEMES[(THEMES.indexOf(theme) + 1) % 3]; store.set("pincer.theme", theme); applyTheme(theme); });

function drawer(open) {
  $("app").classList.toggle("drawer-open", open);
  $("scrim").hidden = !open;
  $("open-drawer").setAttribute("aria-expanded", String(open));
  if (open) $("new-session").focus();
}
$("open-drawer").addEventListener("click", () => drawer(true));
$("close-drawer").addEventListener("click", () => { drawer(false); $("open-drawer").focus(); });
$("scrim").addEventListener("click", () => drawer(false));

// ---- the pieces ---------------------------------------------------------------------------------
const gw = new Gateway({
  onOpen: (again) => onConnected(again),
  onClose: () => { setStatus("disconnected — reconnecting…", false); state.subscribed = null; outbox.onChange(); },
  onAuthError: (message, code) => {
    showError(`Connecting failed: ${message}${code.startsWith("AUTH") ? " — check the token." : ""}`);
    if (code.startsWith("AUTH")) {
      store.remove("pincer.token"); $("token-banner").hidden = false; setStatus("token needed", false);
      state.authFailed = true; composerEnabled();
    }
  },
  onEvent: (ev, p, gap) => onEvent(ev, p, gap),
});

const outbox = new Outbox({
  canSend: (item) => gw.connected && !state.treeBusy && (item.sessionKey !== state.sessionKey || state.runs.size === 0),
  send: async (item) => {
    const params = { sessionKey: item.sessionKey, message: item.text, idempotencyKey: item.key };
    if (item.attachments) params.attachments = item.attachments;
    if (item.expectedLeafEntryId !== undefined) params.expectedLeafEntryId = item.expectedLeafEntryId;
    const r = await gw.request("chat.send", params);
    if ((r.status === "started" || r.status === "in_flight") && item.sessionKey === state.sessionKey) runStarted(r.runId);
    return r;
  },
  onChange: () => { outbox.render($("outbox"), state.sessionKey); },
  onError: (item, e) => showError(`A message could not be sent: ${e.message}`, () => outbox.retry(item.key)),
});

const approvals = new Approvals($("approvals"), {
  resolve: (id, decision) => gw.request("exec.approval.resolve", { id, decision }),
  onError: (text) => showError(text),
});

const composer = new Composer({
  form: $("composer-form"), input: $("composer-input"), attachments: $("attachments"), fileInput: $("file-input"),
  onSubmit: (text, attachments) => {
    if (state.viewing) { showError("This is an archived transcript (read-only): open a chat to write."); return; }
    state.hitId = null;
    outbox.add({ sessionKey: state.sessionKey, text, attachments });
  },
  onError: (text) => showError(text),
});

const view = new MessageView($("log"), {
  editDone: () => composer.focus(),
  canChangeTree: () => state.runs.size === 0 && gw.connected,
  running: () => state.runs.size > 0,
  edit: (id, text) => attempt("Editing failed", async () => {
    const parent = view.byId?.get(id)?.parentId ?? null;
    state.treeBusy = true;
    try {
      await gw.request("sessions.rewind", { sessionKey: state.sessionKey, entryId: id });
      outbox.add({ sessionKey: state.sessionKey, text, expectedLeafEntryId: parent });
    } finally { state.treeBusy = false; }
    await loadHistory();
    outbox.flush();
  }),
  regenerate: (userId) => attempt("Regenerating failed", async () => {
    const r = await gw.request("chat.send", { sessionKey: state.sessionKey, message: "", idempotencyKey: uuid(), regenerateEntryId: userId });
    if (r.status === "started" || r.status === "in_flight") runStarted(r.runId);
  }),
  switchTo: (tip) => attempt("Switching the branch failed", async () => {
    if (view.tree?.leafId === tip) return;
    await gw.request("sessions.branches.switch", { sessionKey: state.sessionKey, leafEntryId: tip });
    await loadHistory();
  }),
  showAll: (id) => attempt("Loading the whole message failed", async () => {
    const r = await gw.request("chat.message.get", { sessionKey: state.sessionKey, messageId: id });
    if (!r.ok) throw new Error(`the message is ${r.unavailableReason || "unavailable"}`);
    view.replace(id, r.message);
  }),
  fullText: async (id) => {
    const r = await gw.request("chat.message.get", { sessionKey: state.sessionKey, messageId: id }).catch(() => null);
    return r?.ok ? textOf(r.message) : null;
  },
  summary: async (id) => {
    const r = await gw.request("chat.message.get", { sessionKey: state.sessionKey, messageId: id }).catch((e) => ({ error: e.message }));
    return r.ok ? textOf(r.message) : `(summary unavailable: ${r.error || r.unavailableReason})`;
  },
  label: (id, label) => attempt("Labelling failed", async () => {
    await gw.request("sessions.label", { sessionKey: state.sessionKey, entryId: id, label: label.trim() || null });
    await loadHistory();
  }),
  loadOlder: (before) => loadOlder(before),
}, $("jump"));

const sidebar = new Sidebar({
  list: $("session-list"), archivedList: $("archived-list"), archiveFiles: $("archive-files"),
  fetchPage: (params) => gw.request("sessions.list", { includeDerivedTitles: true, ...params }),
  actions: {
    // A click goes on to the message box (unless the focus went somewhere else meanwhile: Ctrl+K
    // pressed while the chat loads keeps the search); Enter on a row leaves the focus in the list.
    open: (key, keyboard) => {
      drawer(false);
      const at = document.activeElement;
      selectSession(key).then(() => {
        if (!keyboard && (document.activeElement === at || document.activeElement === document.body)) composer.focus();
      });
    },
    rename: (key, label) => attempt("Renaming failed", async () => { await gw.request("sessions.patch", { key, label: label || null }); await loadSessions(); }),
    exportAs: (key, format) => attempt("Exporting failed", () => download(key, format)),
    archive: (key, on) => attempt(on ? "Archiving failed" : "Restoring failed", async () => {
      await gw.request("sessions.patch", { key, archived: on });
      if (!on) $("archived").open = true;
      await loadSessions();
    }),
    remove: (key) => attempt("Deleting failed", async () => {
      await gw.request("sessions.delete", { key });
      if (key === state.sessionKey) await selectSession(MAIN);
      await loadSessions();
    }),
    viewArchive: (a) => attempt("Opening the archived transcript failed", async () => {
      const r = await gw.request("sessions.archives.get", { file: a.file });
      drawer(false);
      state.viewing = a; sidebar.setCurrent(state.sessionKey, a.file);
      $("session-title").textContent = `Archived: ${a.title || a.file}`;
      view.setTree(null);
      view.setHistory(r.messages, { readOnly: true, hasOlder: r.hasOlder === true });
      composerEnabled();
    }),
  },
});

function newChat() {
  return attempt("Could not create a chat", async () => {
    const r = await gw.request("sessions.create", {});
    drawer(false);
    await selectSession(r.key);
    await loadSessions();
  });
}
$("new-session").addEventListener("click", newChat);

function stop() {
  // Only the run that streams: a follow-up waiting in the outbox is not touched.
  const runId = [...state.runs][0];
  attempt("Stop failed", () => gw.request("chat.abort", runId ? { sessionKey: state.sessionKey, runId } : { sessionKey: state.sessionKey }));
}
$("stop").addEventListener("click", stop);
$("readonly-restore").addEventListener("click", () => attempt("Restoring failed", async () => {
  if (state.viewing) {
    // A transcript set aside by /new, reset or delete: a chat of its own again (sessions.archives.restore).
    const r = await gw.request("sessions.archives.restore", { file: state.viewing.file });
    await selectSession(r.key);
  } else {
    await gw.request("sessions.patch", { key: state.sessionKey, archived: false });
  }
  await loadSessions();
}));

$("model").addEventListener("change", (e) => attempt("Changing the model failed", async () => {
  await gw.request("sessions.patch", { key: state.sessionKey, model: e.target.value });
  await loadSessions();
}));

/** Why nothing can be written here now (shown above the composer, which is then disabled), or null. */
function readOnlyReason() {
  if (state.authFailed === "missing") return { text: "Not connected yet: enter the gateway's token above to start." };
  if (state.authFailed) return { text: "Not connected: the gateway refused the token. Enter a valid token above to write." };
  if (state.viewing) {
    const v = state.viewing;
    return { text: v.reason === "deleted"
      ? "Read-only: the transcript of a deleted chat (kept on disk as an archive)."
      : "Read-only: an earlier transcript of this chat, set aside by /new or a reset.", restoreFile: v.file };
  }
  if (sidebar.row(state.sessionKey)?.archivedAt) return { text: "This chat is archived: restore it to write in it.", restore: true };
  return null;
}

function composerEnabled() {
  const ro = readOnlyReason();
  $("readonly").hidden = !ro;
  $("readonly-text").textContent = ro?.text || "";
  $("readonly-restore").hidden = !ro?.restore && !ro?.restoreFile;
  $("readonly-restore").textContent = ro?.restoreFile ? "Restore as a new chat" : "Restore";
  $("composer-input").disabled = !!ro;
  $("composer-input").placeholder = ro ? "Read-only" : "Message";
  $("stop").disabled = state.runs.size === 0;
  $("send").disabled = !!ro;
  $("send").textContent = state.runs.size && !ro ? "Queue" : "Send";
  $("send").title = state.runs.size ? "The reply is still streaming: this message waits in the outbox and goes when it ends" : "";
  $("log").toggleAttribute("aria-busy", state.runs.size > 0);
}

function runStarted(runId) { state.runs.add(runId); composerEnabled(); }
function runEnded(runId) {
  state.runs.delete(runId); composerEnabled();
  if (state.runs.size === 0) { if (state.refreshWanted) loadHistory(); else loadTree(); }
  outbox.flush();
}

// ---- export and search --------------------------------------------------------------------------
/** Downloads a session's export (GET /api/sessions/{key}/export, behind the token). */
async function download(key, format) {
  const res = await fetch(`/api/sessions/${encodeURIComponent(key)}/export?format=${encodeURIComponent(format)}`,
    { headers: { Authorization: `Bearer ${store.get("pincer.token", "")}` } });
  if (!res.ok) {
    const body = await res.json().catch(() => ({}));
    throw new Error(body.error || `HTTP ${res.status}`);
  }
  const name = /filename="([^"]+)"/.exec(res.headers.get("content-disposition") || "")?.[1] || `pincer-export.${format}`;
  const url = URL.createObjectURL(await res.blob());
  const a = el("a", { href: url, download: name, hidden: true });
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/** The snippet with the query's words marked (text nodes only: nothing is parsed as HTML). */
function marked(snippet, query) {
  const words = [...query.matchAll(/"([^"]+)"|(\S+)/g)].flatMap((m) => (m[1] || m[2]).split(/\s+/))
    .map((w) => w.replace(/\*$/, "").toLowerCase()).filter((w) => /[\p{L}\p{N}]/u.test(w));
  const out = [];
  const re = /[\p{L}\p{N}_]+|[^\p{L}\p{N}_]+/gu;
  for (const [part] of snippet.matchAll(re)) {
    const hit = words.some((w) => part.toLowerCase().startsWith(w));
    out.push(hit && /[\p{L}\p{N}]/u.test(part) ? el("mark", {}, part) : part);
  }
  return out;
}

let searchSeq = 0;
async function runSearch() {
  const query = $("search-input").value.trim();
  const box = $("search-results");
  const seq = ++searchSeq;
  if (!query) { box.hidden = true; box.replaceChildren(); delete box.dataset.query; return; }
  const r = await gw.request("sessions.search", { query, limit: 25, includeArchived: $("search-archived").checked })
    .catch((e) => ({ error: e.message }));
  if (seq !== searchSeq) return;
  box.hidden = false;
  box.dataset.query = query;
  box.dataset.archived = String($("search-archived").checked);
  box.dataset.indexing = String(!!r.indexing);
  const busy = r.indexing ? el("div", { class: "none", "data-testid": "search-indexing" }, "Still indexing: results may be incomplete.") : null;
  if (r.error) { box.replaceChildren(el("div", { class: "none", "data-testid": "search-error" }, r.error)); return; }
  if (!r.results.length) { box.replaceChildren(...[busy, el("div", { class: "none", "data-testid": "search-none" }, "No matches.")].filter(Boolean)); return; }
  box.replaceChildren(...[busy].filter(Boolean), el("ul", {}, ...r.results.map((h) => el("li", {},
    el("button", { type: "button", "data-testid": "search-hit", "data-key": h.sessionKey, "data-entry-id": h.entryId, onclick: () => openHit(h) },
      el("span", { class: "name" }, h.title || h.sessionKey),
      el("span", { class: "snippet" }, ...marked(h.snippet, query)),
      el("span", { class: "sub" }, `${h.role} · ${new Date(h.timestamp).toLocaleString()}${h.archived ? " · archived" : ""}`))))));
}

/** Opens a hit: its session, on the branch that holds the entry (switching to that branch's
 *  newest tip when it is not the active one), scrolled to the entry. */
async function openHit(h) {
  await attempt("Opening the search result failed", async () => {
    drawer(false);
    if (h.sessionKey !== state.sessionKey || state.viewing) await selectSession(h.sessionKey);
    const t = await gw.request("sessions.tree", { sessionKey: h.sessionKey });
    const parent = new Map(t.nodes.map((n) => [n.id, n.parentId]));
    const onActive = new Set();
    for (let id = t.leafId; id && !onActive.has(id); id = parent.get(id)) onActive.add(id);
    const node = t.nodes.find((n) => n.id === h.entryId);
    if (node && !onActive.has(h.entryId) && node.tipId && node.tipId !== t.leafId) {
      await gw.request("sessions.branches.switch", { sessionKey: h.sessionKey, leafEntryId: node.tipId });
    }
    await loadHistory();
    const find = () => $("log").querySelector(`[data-entry-id="${CSS.escape(h.entryId)}"]`);
    // Older windows (large ones) until the hit is on the page, however far back it is.
    while (!find() && view.hasOlder && h.sessionKey === state.sessionKey) {
      const first = view.firstId();
      // (A window the scrolling asked for meanwhile counts as progress too.)
      if (!(await loadOlder(first, 1000)) && view.firstId() === first) break;
    }
    if (!find()) throw new Error("the message is no longer on this chat's branches");
    state.hitId = h.entryId;
    markHit();
  });
}

/** Keeps the opened search hit marked and in view when the history is drawn again. */
function markHit() {
  if (!state.hitId) return;
  for (const old of $("log").querySelectorAll(".hit")) old.classList.remove("hit");
  const target = $("log").querySelector(`[data-entry-id="${CSS.escape(state.hitId)}"]`);
  if (!target) return;
  target.classList.add("hit");
  target.scrollIntoView({ block: "center" });
}

let searchTimer = null;
$("search-input").addEventListener("input", () => { clearTimeout(searchTimer); searchTimer = setTimeout(runSearch, 200); });
$("search-archived").addEventListener("change", runSearch);
$("search-form").addEventListener("submit", (e) => { e.preventDefault(); clearTimeout(searchTimer); runSearch(); });

// ---- loading ------------------------------------------------------------------------------------
async function loadTree() {
  const t = await gw.request("sessions.tree", { sessionKey: state.sessionKey }).catch(() => null);
  view.setTree(t);
  view.draw();
}

async function loadHistory() {
  if (state.viewing) return;
  if (state.runs.size) { state.refreshWanted = true; }
  const key = state.sessionKey;
  const [h, t] = await Promise.all([
    gw.request("chat.history", { sessionKey: key, limit: WINDOW }),
    gw.request("sessions.tree", { sessionKey: key }).catch(() => null),
  ]).catch((e) => { if (!e.transport) showError(`Could not load the history: ${e.message}`, loadHistory); return [null, null]; });
  if (!h || key !== state.sessionKey) return;
  state.refreshWanted = false;
  // What the gateway runs now is the truth: a bubble of a run cut by a restart (or ended while
  // away) goes; a run resumed after the restart keeps streaming into its own.
  state.runs = new Set((h.sessionInfo && h.sessionInfo.activeRunIds) || []);
  view.keepStreams(state.runs);
  view.setTree(t);
  // The older windows already on the page stay when the newest one still starts inside them.
  const idOf = (m) => m?.__openclaw?.id;
  const at = idOf(h.messages[0]) ? view.messages.findIndex((m) => idOf(m) === idOf(h.messages[0])) : -1;
  const readOnly = !!sidebar.row(key)?.archivedAt;
  if (at > 0) view.setHistory(view.messages.slice(0, at).concat(h.messages), { hasOlder: view.hasOlder, readOnly });
  else view.setHistory(h.messages, { hasOlder: h.hasOlder === true, readOnly });
  markHit();
  composerEnabled();
  outbox.flush();
}

/** The window before entry `before` (of the chat shown), drawn above; false when none came. */
async function loadOlder(before, limit = WINDOW) {
  const [key, viewing] = [state.sessionKey, state.viewing];
  const h = await (viewing
    ? gw.request("sessions.archives.get", { file: viewing.file, limit, beforeEntryId: before })
    : gw.request("chat.history", { sessionKey: key, limit, beforeEntryId: before }))
    .catch((e) => { if (!e.transport) showError(`Could not load older messages: ${e.message}`); return null; });
  if (!h || key !== state.sessionKey || state.viewing !== viewing || view.firstId() !== before) return false;
  view.prepend(h.messages, h.hasOlder === true);
  return h.messages.length > 0;
}

let sessionsTimer = null;
function loadSessionsSoon() { clearTimeout(sessionsTimer); sessionsTimer = setTimeout(loadSessions, 250); }

async function loadSessions() {
  const ok = await sidebar.refresh().then(() => true, (e) => {
    if (!e.transport) showError(`Could not list the chats: ${e.message}`, loadSessions);
    return false;
  });
  if (!ok) return;
  const a = await gw.request("sessions.archives.list", {}).catch(() => null);
  if (a) sidebar.setArchives(a.archives);
  await currentRow();
  sidebar.setCurrent(state.sessionKey, state.viewing?.file);
  showTitle();
}

/** The open chat's row when no page loaded holds it (an old chat opened by its address or a search hit). */
async function currentRow() {
  const key = state.sessionKey;
  if (sidebar.loaded(key)) { if (sidebar.extra) sidebar.setExtra(null); return; }
  const d = await gw.request("sessions.describe", { key, includeDerivedTitles: true }).catch(() => null);
  if (d?.session && key === state.sessionKey) sidebar.setExtra({ ...d.session, key: d.key || key });
}

function showTitle() {
  const row = sidebar.row(state.sessionKey);
  if (!state.viewing) $("session-title").textContent = row ? titleOf(row) : "New chat";
  document.title = `${row ? titleOf(row) : "Pincer"} · Pincer WebChat`;
  drawModels(row);
  composerEnabled();
  // An archived chat's messages lose their edit, regenerate and label buttons (and get them back).
  const archived = !!row?.archivedAt;
  if (!state.viewing && view.readOnly !== archived && view.messages.length) { view.readOnly = archived; view.draw(); }
}

function drawModels(row) {
  const sel = $("model");
  const models = state.models?.models || [];
  const current = row?.model || state.models?.default || "";
  const specs = models.map((m) => `${m.provider}/${m.id}`);
  if (current && !specs.includes(current)) specs.unshift(current);
  sel.replaceChildren(...specs.map((s) => el("option", { value: s }, s)));
  sel.value = current;
  sel.disabled = specs.length < 2;
}

/** Shows chat `key`; `push: false` when the address already names it (load, Back/Forward). */
async function selectSession(key, { push = true } = {}) {
  const prev = state.subscribed;
  const focused = document.activeElement;
  state.hitId = null;
  state.viewing = null;
  // One message subscription per socket; unsubscribe first, and only from another key.
  if (prev && prev !== key) { state.subscribed = null; await gw.request("sessions.messages.unsubscribe", { key: prev }).catch(() => {}); }
  if (key !== state.sessionKey) { state.runs.clear(); view.clear("Loading…"); }
  state.sessionKey = key; store.set("pincer.session", key);
  if (location.hash !== chatHref(key)) history[push ? "pushState" : "replaceState"](null, "", chatHref(key));
  composer.setSession(key);
  approvals.setSession(key);
  outbox.onChange();
  sidebar.setCurrent(key);
  showTitle();
  if (gw.connected) currentRow().then(showTitle);
  if (state.subscribed !== key && gw.connected) {
    await gw.request("sessions.messages.subscribe", { key }).then(() => { state.subscribed = key; }).catch(() => {});
  }
  if (gw.connected) await loadHistory();
  // The message box, unless the focus went somewhere else meanwhile (Ctrl+K, the list's keys).
  if (document.activeElement === focused || document.activeElement === document.body) composer.focus();
}

/** Back/Forward (or an edited address): the chat the address names. */
function followUrl() {
  const key = keyFromUrl();
  if (key && (key !== state.sessionKey || state.viewing)) { drawer(false); selectSession(key, { push: false }); }
}
window.addEventListener("popstate", followUrl);

async function onConnected(again) {
  showError("");
  state.authFailed = false;
  $("token-banner").hidden = true;
  setStatus(again ? "reconnected" : "connected", true);
  state.info = await gw.request("pincer.info", {}).catch(() => null);
  setLimits(state.info?.limits);
  state.models = await gw.request("models.list", {}).catch(() => null);
  showNotice(state.info?.modelIsFallback
    ? `No model provider is configured: replies come from Pincer's offline echo model. Configure one in ${state.info.configFile} ([models.providers.*]) or set OPENAI_API_KEY / ANTHROPIC_API_KEY and restart the gateway.`
    : "");
  await gw.request("sessions.subscribe", {}).catch(() => {});
  // The approvals waiting (announced while away, or before a restart of the gateway).
  approvals.set(await gw.request("exec.approval.list", {}).catch(() => []));
  await loadSessions();
  await selectSession(state.sessionKey, { push: false }); // also catches up on what was missed while away
  outbox.flush();
}

// ---- events -------------------------------------------------------------------------------------
const TREE_REASONS = new Set(["branch-switch", "rewind", "regenerate", "label", "reset", "delete"]);

function onEvent(ev, p, gap) {
  if (gap && p.sessionKey === state.sessionKey) loadHistory();
  if (ev === "session.message") {
    if (p.sessionKey !== state.sessionKey || state.viewing) return;
    view.addPersisted(p.message);
    return;
  }
  if (ev === "chat") {
    if (p.sessionKey !== state.sessionKey) { if (["final", "aborted", "error"].includes(p.state)) outbox.flush(); return; }
    if (state.viewing) return;
    if (p.state === "delta") {
      if (!state.runs.has(p.runId)) runStarted(p.runId);
      view.delta(p.runId, p.message);
    } else if (["final", "aborted", "error"].includes(p.state)) {
      let final = p.message ? { ...p.message } : null;
      if (final && p.state === "error") { final.stopReason = "error"; final.errorMessage = p.errorMessage; }
      // A failed run is shown once, in the thread where it happened (not also in the banner).
      if (!final && p.state === "error") final = { role: "assistant", content: [], stopReason: "error", errorMessage: p.errorMessage || "The run failed.", timestamp: Date.now() };
      view.endRun(p.runId, final);
      runEnded(p.runId);
    }
    return;
  }
  if (ev === "sessions.changed") {
    loadSessionsSoon();
    if (p.sessionKey === state.sessionKey && TREE_REASONS.has(p.reason)) {
      if (p.reason === "reset" || p.reason === "delete") view.clear();
      loadHistory();
    }
    return;
  }
  if (ev === "agent" && p.stream === "tool" && p.sessionKey === state.sessionKey) {
    if (!state.viewing) view.toolEvent(p.data);
    return;
  }
  if (ev === "agent" && p.stream === "compaction" && p.sessionKey === state.sessionKey) {
    const phase = p.data && p.data.phase;
    showNotice(phase === "start" ? "Compacting older turns…" : phase === "error" ? `Compaction failed: ${p.data.error || ""}` : "");
    if (phase === "end") loadHistory();
    return;
  }
  if (ev === "exec.approval.requested") { approvals.add(p); return; }
  if (ev === "exec.approval.resolved") { approvals.remove(p.id); return; }
  if (ev === "shutdown") setStatus("gateway stopping", false);
}

// ---- the token ----------------------------------------------------------------------------------
/** `#token=…` in the address (on load or added later to an open tab) is stored and removed (a
 *  `chat=` beside it stays). */
function tokenFromHash() {
  const m = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (!m) return false;
  store.set("pincer.token", decodeURIComponent(m[1]));
  const rest = location.hash.slice(1).split("&").filter((p) => p && !p.startsWith("token=")).join("&");
  history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
  return true;
}
function start() {
  const token = store.get("pincer.token");
  if (!token) { $("token-banner").hidden = false; setStatus("token needed", false); state.authFailed = "missing"; composerEnabled(); return; }
  setStatus("connecting…");
  gw.connect(token);
}
window.addEventListener("hashchange", () => { if (tokenFromHash()) start(); else followUrl(); });
$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const t = $("token-input").value.trim();
  if (!t) return;
  store.set("pincer.token", t); $("token-input").value = "";
  state.authFailed = false; composerEnabled();
  start();
});
// Another tab sent what was queued here: keep the list in step.
window.addEventListener("storage", (e) => { if (e.key === "pincer.outbox") { outbox.items = store.getJSON("pincer.outbox", []); outbox.onChange(); } });

// ---- keyboard shortcuts (listed in the help overlay, index.html) ---------------------------------
const typing = (t) => t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT" || t.isContentEditable);
function help(open) {
  const d = $("help");
  if (open && !d.open) d.showModal(); else if (!open && d.open) d.close();
}
$("help-open").addEventListener("click", () => help(true));
$("help-close").addEventListener("click", () => help(false));
document.addEventListener("keydown", (e) => {
  const mod = e.ctrlKey || e.metaKey;
  if (e.key === "Escape") {
    if (e.defaultPrevented || $("help").open || e.target === $("search-input")) return;
    if ($("app").classList.contains("drawer-open")) { drawer(false); $("open-drawer").focus(); return; }
    if (state.runs.size && !state.viewing) { e.preventDefault(); stop(); }
    return;
  }
  if (mod && e.shiftKey && (e.key === "o" || e.key === "O")) { e.preventDefault(); newChat(); return; }
  if (mod && !e.shiftKey && (e.key === "k" || e.key === "K")) {
    e.preventDefault();
    if (window.matchMedia("(max-width: 760px)").matches) drawer(true);
    $("search-input").focus(); $("search-input").select();
    return;
  }
  if ((mod && e.key === "/") || (e.key === "?" && !typing(e.target))) { e.preventDefault(); help(!$("help").open); return; }
  if (e.key === "ArrowUp" && e.target === $("composer-input") && !e.target.value && !mod && !e.shiftKey && !e.altKey) {
    if (view.editLast()) e.preventDefault();
  }
});

tokenFromHash();
if (keyFromUrl()) state.sessionKey = keyFromUrl();
composer.setSession(state.sessionKey);
approvals.setSession(state.sessionKey);
outbox.onChange();
composerEnabled();
start();
