// The message list: the active branch as chat.history gives it, in windows (older ones are loaded
// as the list scrolls up, or with "Load older messages", down to the first message), drawn with
// Markdown, images, date separators, timestamps (full date on hover), model and usage, each an
// article named by its author; the tree's controls on each message (edit a user message, regenerate
// a reply, "‹ 2/3 ›" between siblings, a label, copy); compaction dividers whose summary can be
// opened; "show all" for texts history cut; "jump to latest"; the streaming bubble of a run
// (aria-busy while it streams; dropped after a reconnect when the gateway no longer runs it); a
// question's markers after a crash (resumed, interrupted, no reply, with Regenerate on the last two); a card per tool call (name, arguments, result or error; collapsible),
// live from the `agent` tool stream (a running call's output so far, from its `update` events, until
// the result replaces it) and rebuilt from the toolCall blocks and toolResult rows.
import { renderMarkdown, copyText } from "/webchat/js/markdown.js";
import { el, textOf, toMs, shortTime, fullTime, TRUNCATED } from "/webchat/js/util.js";

/** Messages shown by role, for screen readers. */
const AUTHOR = { user: "You", assistant: "Assistant", tool: "Tool result" };

export class MessageView {
  /** actions: edit, regenerate, switchTo, showAll, summary, label, loadOlder, canChangeTree, running; jump: the "latest" button */
  constructor(log, actions, jump) {
    this.log = log; this.actions = actions; this.jump = jump;
    this.messages = []; this.tree = null; this.streams = new Map(); this.hasOlder = false; this.readOnly = false;
    this.loadingOlder = false;
    /** Tool calls seen on the `agent` stream: toolCallId → {status, result, output}. */
    this.toolLive = new Map();
    log.addEventListener("scroll", () => this.onScroll(), { passive: true });
    jump?.addEventListener("click", () => { this.log.scrollTop = this.log.scrollHeight; this.log.focus({ preventScroll: true }); });
  }

  /** Near the top: the next older window; away from the bottom: the "latest" button. */
  onScroll() {
    const l = this.log;
    if (this.hasOlder && !this.loadingOlder && l.scrollTop < 400 && l.scrollHeight > l.clientHeight) this.older();
    if (this.jump) this.jump.hidden = l.scrollHeight - l.scrollTop - l.clientHeight < 300;
  }

  /** Asks for the window before the first message shown (once at a time). */
  async older() {
    if (this.loadingOlder || !this.hasOlder) return;
    this.loadingOlder = true;
    try { await this.actions.loadOlder(this.firstId()); } finally { this.loadingOlder = false; }
  }

  /** The id of the oldest message shown (the `before` of the next window). */
  firstId() { return this.messages.map((m) => this.idOf(m)).find(Boolean) ?? null; }

  /** An older window arrived: drawn above, with the view kept where it was. */
  prepend(messages, hasOlder) {
    const have = new Set(this.messages.map((m) => this.idOf(m)).filter(Boolean));
    const fresh = messages.filter((m) => !have.has(this.idOf(m)));
    this.messages = fresh.concat(this.messages);
    this.hasOlder = hasOlder && fresh.length > 0;
    const l = this.log;
    const fromBottom = l.scrollHeight - l.scrollTop;
    l.querySelector(".older")?.remove();
    const first = l.firstChild;
    const nodes = fresh.map((m) => this.renderOne(m));
    if (this.hasOlder) nodes.unshift(this.olderButton());
    for (const n of nodes) l.insertBefore(n, first);
    this.separate();
    l.scrollTop = l.scrollHeight - fromBottom;
    this.onScroll();
  }

  olderButton() {
    return el("button", { type: "button", class: "older", "data-testid": "load-older", onclick: () => this.older() }, "Load older messages");
  }

  /** A date line before the first message of each day. */
  separate() {
    for (const s of this.log.querySelectorAll(".day-sep")) s.remove();
    let last = null;
    for (const n of this.log.querySelectorAll(":scope > [data-ts]")) {
      const d = new Date(Number(n.dataset.ts));
      const day = d.toDateString();
      if (day === last) continue;
      last = day;
      const today = new Date().toDateString() === day;
      n.before(el("div", { class: "day-sep", role: "separator", "data-testid": "day-separator" },
        el("span", {}, today ? "Today" : d.toLocaleDateString([], { weekday: "long", year: "numeric", month: "long", day: "numeric" }))));
    }
  }

  clear(placeholder) {
    this.messages = []; this.streams.clear(); this.tree = null;
    this.log.replaceChildren(placeholder ? el("p", { class: "empty" }, placeholder) : "");
  }

  /** The tree from `sessions.tree`: parents, roles and the newest tip under each message. */
  setTree(tree) {
    this.tree = tree;
    this.byId = new Map((tree?.nodes || []).map((n) => [n.id, n]));
    this.children = new Map();
    for (const n of tree?.nodes || []) {
      const k = n.parentId ?? "";
      if (!this.children.has(k)) this.children.set(k, []);
      this.children.get(k).push(n);
    }
  }

  setHistory(messages, { hasOlder = false, readOnly = false } = {}) {
    this.messages = messages.slice(); this.hasOlder = hasOlder; this.readOnly = readOnly;
    this.draw();
  }

  draw() {
    const nodes = [];
    if (this.hasOlder) nodes.push(this.olderButton());
    for (const m of this.messages) nodes.push(this.renderOne(m));
    if (!this.messages.length) nodes.push(el("p", { class: "empty" }, this.readOnly ? "This transcript has no messages." : "No messages yet. Say hello."));
    for (const s of this.streams.values()) if (s.isConnected || s.dataset.run) nodes.push(s);
    this.log.replaceChildren(...nodes);
    this.separate();
    this.scrollDown(true);
    this.busy();
    requestAnimationFrame(() => this.onScroll());
  }

  /** aria-busy on the log while a reply streams. */
  busy() {
    if ([...this.streams.values()].some((s) => s.isConnected)) this.log.setAttribute("aria-busy", "true");
    else this.log.removeAttribute("aria-busy");
  }

  scrollDown(force) {
    const l = this.log;
    if (force || l.scrollHeight - l.scrollTop - l.clientHeight < 160) l.scrollTop = l.scrollHeight;
  }

  idOf(m) { return m?.__openclaw?.id; }

  has(id) { return !!id && this.messages.some((m) => this.idOf(m) === id); }

  /** A persisted message arrived live (session.message). */
  addPersisted(msg) {
    const id = this.idOf(msg);
    if (id && this.has(id)) return;
    this.messages.push(msg);
    const node = this.renderOne(msg);
    if (msg.role === "toolResult") this.refreshCard(msg.toolCallId);
    if (msg.role === "assistant") {
      // The streaming bubble of its run becomes this message.
      const first = [...this.streams.entries()][0];
      if (first) { first[1].replaceWith(node); this.streams.delete(first[0]); this.scrollDown(); return; }
    }
    this.log.querySelector(".empty")?.remove();
    const firstStream = [...this.streams.values()][0];
    if (firstStream?.isConnected) firstStream.before(node); else this.log.append(node);
    this.separate();
    this.scrollDown();
  }

  /** A `chat` delta: the accumulated text of the run's current message. */
  delta(runId, msg) {
    const text = textOf(msg);
    if (!text) return;
    let b = this.streams.get(runId);
    if (!b || !b.isConnected) {
      b = el("div", { class: "msg assistant streaming", "data-testid": "streaming", "data-run": runId, role: "article", "aria-label": "Assistant (replying)", "aria-busy": "true" }, el("div", { class: "body" }));
      this.streams.set(runId, b);
      this.log.querySelector(".empty")?.remove();
      this.log.append(b);
      this.busy();
    }
    renderMarkdown(b.querySelector(".body"), text);
    this.scrollDown();
  }

  /** After a reconnect: the bubbles of runs the gateway no longer runs go (their text is in the
   *  history, or the run was cut); a run still going (resumed after a restart) keeps its own. */
  keepStreams(active) {
    for (const [runId, b] of this.streams) if (!active.has(runId)) { b.remove(); this.streams.delete(runId); }
    this.busy();
  }

  /** True when the user message `msg` has no reply on the branch shown: the next user message (or
   *  the end) comes before any reply that ends a turn. The last one is not, while a run goes on. */
  unanswered(msg) {
    const i = this.messages.indexOf(msg);
    for (let j = i + 1; j < this.messages.length; j++) {
      const m = this.messages[j];
      if (m.role === "user") return true;
      if (m.role === "assistant" && (m.stopReason !== "toolUse" || m.clientToolCalls)) return false;
    }
    return !this.actions.running();
  }

  /** The run ended: its bubble goes (the persisted message replaces it, or a reload does). */
  endRun(runId, final) {
    const b = this.streams.get(runId);
    this.streams.delete(runId);
    if (!b) return;
    if (final && !this.has(this.idOf(final))) {
      const node = this.renderOne(final);
      b.replaceWith(node);
      if (this.idOf(final)) this.messages.push(final);
    } else {
      b.remove();
    }
    this.separate();
    this.busy();
  }

  siblings(id) {
    const n = this.byId?.get(id);
    if (!n) return null;
    const sibs = (this.children.get(n.parentId ?? "") || []).filter((s) => s.role === n.role);
    return sibs.length > 1 ? { sibs, at: sibs.findIndex((s) => s.id === id) } : null;
  }

  /** The user row a reply answers: the nearest user message before it on the branch. */
  userBefore(msg) {
    const i = this.messages.indexOf(msg);
    for (let j = i - 1; j >= 0; j--) if (this.messages[j].role === "user" && this.idOf(this.messages[j])) return this.idOf(this.messages[j]);
    return null;
  }

  renderOne(m) {
    const meta = m.__openclaw || {};
    const id = meta.id;
    if (meta.kind === "compaction") return this.renderCompaction(m, id);
    const role = m.role === "toolResult" ? "tool" : m.role === "user" ? "user" : "assistant";
    const ms = toMs(m.timestamp) ?? meta.recordTimestampMs;
    const author = role === "assistant" && m.model && m.model !== "gateway-injected" ? `Assistant (${m.model})` : AUTHOR[role];
    const node = el("div", { class: `msg ${role}`, "data-testid": "message", "data-role": role, "data-entry-id": id, "data-ts": ms || null, role: "article", "aria-label": author });
    const body = el("div", { class: "body" });
    const text = textOf(m);
    const calls = role === "assistant" && Array.isArray(m.content) ? m.content.filter((b) => b.type === "toolCall") : [];
    if (role === "tool") {
      body.textContent = text || "(tool result)";
      // Shown in its call's card when the call is in the list.
      if (this.callOf(m.toolCallId)) node.hidden = true;
    } else {
      renderMarkdown(body, text);
      if (!text && !calls.length && m.stopReason !== "error") body.textContent = "…";
    }
    if (text || !calls.length) node.append(body);
    for (const c of calls) node.append(this.toolCard(c));
    const images = Array.isArray(m.content) ? m.content.filter((b) => b.type === "image") : [];
    if (images.length) {
      node.append(el("div", { class: "thumbs" }, images.map((b) => b.data
        ? el("img", { src: `data:${b.mimeType};base64,${b.data}`, alt: "attached image" })
        : el("span", { class: "omitted" }, `[image${b.bytes ? `, ${Math.round(b.bytes / 1024)} KB` : ""}]`))));
    }
    if (m.stopReason === "error") { node.classList.add("error"); node.append(el("div", { class: "err" }, `⚠ ${m.errorMessage || "error"}`)); }
    if (m.openclawAbort) node.classList.add("aborted");
    node.append(this.renderMeta(m, id, role, text));
    return node;
  }

  /** The assistant message's toolCall block with this id, if shown. */
  callOf(callId) {
    if (!callId) return null;
    for (const m of this.messages) {
      if (m.role !== "assistant" || !Array.isArray(m.content)) continue;
      const c = m.content.find((b) => b.type === "toolCall" && b.id === callId);
      if (c) return c;
    }
    return null;
  }

  /** A tool call's card: its status from the toolResult row, else from the live events. */
  toolCard(call) {
    const row = this.messages.find((x) => x.role === "toolResult" && x.toolCallId === call.id);
    const live = this.toolLive.get(call.id);
    const status = row ? (row.isError ? "error" : "ok") : live?.status || "running";
    const result = row ? textOf(row) : live?.result;
    const args = call.arguments && typeof call.arguments === "object" ? call.arguments : {};
    const brief = Object.values(args).filter((v) => typeof v === "string").join(" ").slice(0, 80);
    const label = { running: "running…", ok: "✓ done", error: "✗ failed" }[status];
    const card = el("details", { class: `tool-card ${status}`, "data-testid": "tool-call", "data-tool": call.name, "data-status": status, "data-call-id": call.id },
      el("summary", {}, el("span", { class: "tool-name" }, `⚙ ${call.name}`), el("span", { class: "tool-brief" }, brief), el("span", { class: "tool-status", "data-testid": "tool-status" }, label)),
      el("div", { class: "tool-part" }, "Arguments"),
      el("pre", { "data-testid": "tool-args" }, JSON.stringify(args, null, 2)));
    if (result !== undefined) {
      card.append(el("div", { class: "tool-part" }, status === "error" ? "Error" : "Result"),
        el("pre", { "data-testid": "tool-result" }, result || "(empty)"));
    }
    const output = status === "running" ? live?.output : undefined;
    if (output) {
      // The tail of the output so far, scrolled to its end; opened at the first output so that it
      // is seen as it grows (then left as the reader sets it).
      const pre = el("pre", { class: "tool-output", "data-testid": "tool-output" }, output);
      card.append(el("div", { class: "tool-part" }, "Output so far"), pre);
      if (!live.opened) card.open = live.opened = true;
      requestAnimationFrame(() => { pre.scrollTop = pre.scrollHeight; });
    }
    if (status === "error") card.open = true;
    return card;
  }

  /** Redraws a call's card (kept open or closed as the reader left it). */
  refreshCard(callId) {
    const old = this.log.querySelector(`[data-testid="tool-call"][data-call-id="${CSS.escape(callId)}"]`);
    const call = this.callOf(callId);
    if (!old || !call) return;
    const card = this.toolCard(call);
    if (old.open) card.open = true;
    old.replaceWith(card);
  }

  /** An `agent` event of the tool stream (OpenClaw's shape: phase start/update/result). */
  toolEvent(d) {
    if (!d || !d.toolCallId) return;
    if (d.phase === "start") this.toolLive.set(d.toolCallId, { status: "running" });
    else if (d.phase === "update") {
      const live = this.toolLive.get(d.toolCallId);
      if (live && live.status !== "running") return; // a late update never undoes the result
      const p = d.partialResult && Array.isArray(d.partialResult.content) ? d.partialResult : null;
      const output = p ? textOf(p).replace(/\n$/, "") : live?.output;
      this.toolLive.set(d.toolCallId, { ...live, status: "running", output });
      // A card already showing output takes the new text in place (no flicker, scroll kept at the end).
      const pre = this.log.querySelector(`[data-testid="tool-call"][data-call-id="${CSS.escape(d.toolCallId)}"] [data-testid="tool-output"]`);
      if (pre && output) {
        const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        pre.textContent = output;
        if (atEnd) pre.scrollTop = pre.scrollHeight;
        return;
      }
    } else if (d.phase === "result") {
      const content = d.result && Array.isArray(d.result.content) ? d.result : null;
      this.toolLive.set(d.toolCallId, { status: d.isError ? "error" : "ok", result: content ? textOf(content) : undefined });
    } else return;
    this.refreshCard(d.toolCallId);
  }

  renderMeta(m, id, role, text) {
    const a = this.actions;
    const bits = el("div", { class: "meta" });
    const label = id && this.tree?.labels?.[id];
    if (label) bits.append(el("span", { class: "label-chip", "data-testid": "label" }, label));
    const sib = id ? this.siblings(id) : null;
    if (sib && !this.readOnly) {
      const go = (d) => () => a.switchTo(sib.sibs[sib.at + d].tipId || sib.sibs[sib.at + d].id);
      bits.append(el("span", { class: "nav", "data-testid": "branch-nav" },
        el("button", { type: "button", "data-testid": "branch-prev", "aria-label": "Previous version", disabled: sib.at <= 0 || !a.canChangeTree(), onclick: go(-1) }, "‹"),
        el("span", { "data-testid": "branch-pos", "aria-label": `version ${sib.at + 1} of ${sib.sibs.length}` }, `${sib.at + 1}/${sib.sibs.length}`),
        el("button", { type: "button", "data-testid": "branch-next", "aria-label": "Next version", disabled: sib.at >= sib.sibs.length - 1 || !a.canChangeTree(), onclick: go(1) }, "›")));
    }
    const ms = toMs(m.timestamp) ?? meta(m).recordTimestampMs;
    if (ms) bits.append(el("time", { datetime: new Date(ms).toISOString(), title: fullTime(ms), "data-testid": "timestamp" }, shortTime(ms)));
    if (role === "assistant" && m.model && m.model !== "gateway-injected") bits.append(el("span", {}, m.model));
    if (m.openclawAbort) bits.append(el("span", {}, "stopped"));
    const u = m.usage;
    if (role === "assistant" && u && (u.input || u.output)) bits.append(el("span", { "data-testid": "usage", title: "tokens: input / output" }, `${u.input || 0} in · ${u.output || 0} out`));
    if (text.endsWith(TRUNCATED) && id) bits.append(el("button", { type: "button", "data-testid": "show-all", onclick: () => a.showAll(id) }, "Show all"));
    if (text && role !== "tool") {
      bits.append(el("button", { type: "button", class: "act", "data-testid": "copy-message", "aria-label": "Copy this message", onclick: async (e) => {
        const btn = e.currentTarget;
        const full = text.endsWith(TRUNCATED) && id ? (await a.fullText(id)) ?? text : text;
        copyText(full, btn, "Copy");
      } }, "Copy"));
    }
    // What the gateway's recovery did with this turn after a crash or restart (sessions.tree's turns).
    const turn = role === "user" && id ? this.tree?.turns?.[id] : null;
    if (turn?.resumed) {
      bits.append(el("span", { class: "turn-mark", "data-testid": "turn-resumed", title: "The gateway stopped during this turn and ran it again by itself" },
        turn.resumed > 1 ? `↻ resumed after a restart (${turn.resumed}×)` : "↻ resumed after a restart"));
    }
    const unanswered = role === "user" && id && this.unanswered(m);
    if (turn?.interrupted && unanswered) bits.append(el("span", { class: "turn-mark bad", "data-testid": "turn-interrupted", title: turn.interrupted }, "⚠ interrupted: no reply"));
    else if (unanswered) bits.append(el("span", { class: "turn-mark bad", "data-testid": "unanswered", title: "No reply was written for this message" }, "no reply"));
    if (id && !this.readOnly) {
      if (role === "user") bits.append(el("button", { type: "button", class: "act", "data-testid": "edit", "aria-label": "Edit this message", disabled: !a.canChangeTree(), onclick: () => this.startEdit(m, id) }, "Edit"));
      // An unanswered question is answered again from where it stands (a reply under it).
      if (unanswered) bits.append(el("button", { type: "button", class: "act", "data-testid": "regenerate", "aria-label": "Answer this message again", disabled: !a.canChangeTree(), onclick: () => a.regenerate(id) }, "Regenerate"));
      // A slash command's answer comes from the gateway, not the model: nothing to regenerate.
      const injected = m.model === "gateway-injected" && !m.openclawAbort;
      const user = role === "assistant" && !injected ? this.userBefore(m) : null;
      if (user) bits.append(el("button", { type: "button", class: "act", "data-testid": "regenerate", "aria-label": "Regenerate this reply", disabled: !a.canChangeTree(), onclick: () => a.regenerate(user) }, "Regenerate"));
      bits.append(el("button", { type: "button", class: "act", "data-testid": "set-label", "aria-label": label ? "Change the label" : "Add a label", onclick: () => {
        const v = prompt("Label for this message (empty to remove):", label || "");
        if (v !== null) a.label(id, v);
      } }, label ? "Relabel" : "Label"));
    }
    return bits;
  }

  /** Inline editor; Save makes the new text a new branch from the message's parent. */
  async startEdit(m, id) {
    const node = this.log.querySelector(`[data-entry-id="${CSS.escape(id)}"]`);
    if (!node) return;
    let text = textOf(m);
    if (text.endsWith(TRUNCATED)) text = (await this.actions.fullText(id)) ?? text;
    const ta = el("textarea", { "aria-label": "Edited message (Enter saves and sends, Escape cancels)", "data-testid": "edit-input" });
    ta.value = text;
    const cancel = () => { this.draw(); this.actions.editDone?.(); };
    const save = () => { const t = ta.value; if (t.trim()) this.actions.edit(id, t); };
    ta.addEventListener("keydown", (e) => {
      if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); cancel(); }
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) { e.preventDefault(); save(); }
    });
    node.replaceChildren(el("div", { class: "edit-box" }, ta, el("div", { class: "btns" },
      el("button", { type: "button", onclick: cancel }, "Cancel"),
      el("button", { type: "button", class: "primary", "data-testid": "edit-save", onclick: save }, "Save & send"))));
    ta.focus();
  }

  renderCompaction(m, id) {
    const ms = toMs(m.timestamp);
    const box = el("div", { class: "divider", "data-testid": "compaction-divider", "data-entry-id": id, "data-ts": ms || null, role: "separator" });
    const btn = el("button", { type: "button", "aria-expanded": "false", "data-testid": "compaction-summary" }, "Show summary");
    btn.addEventListener("click", async () => {
      const open = btn.getAttribute("aria-expanded") === "true";
      box.querySelector(".summary")?.remove();
      btn.setAttribute("aria-expanded", String(!open));
      btn.textContent = open ? "Show summary" : "Hide summary";
      if (!open) box.append(el("div", { class: "summary", "data-testid": "compaction-text" }, (await this.actions.summary(id)) || "(no summary)"));
    });
    box.append("Earlier turns were summarised (compaction) ", btn);
    return box;
  }

  /** Replaces one message with its full version (chat.message.get). */
  replace(id, full) {
    const i = this.messages.findIndex((m) => this.idOf(m) === id);
    if (i < 0) return;
    this.messages[i] = full;
    const old = this.log.querySelector(`[data-entry-id="${CSS.escape(id)}"]`);
    if (old) old.replaceWith(this.renderOne(full));
  }

  /** Starts editing the last message of the user on the branch shown (↑ in an empty composer). */
  editLast() {
    if (this.readOnly || !this.actions.canChangeTree()) return false;
    const m = [...this.messages].reverse().find((x) => x.role === "user" && this.idOf(x));
    if (!m) return false;
    this.startEdit(m, this.idOf(m));
    return true;
  }
}

function meta(m) { return m.__openclaw || {}; }
