// The message list: the active branch as chat.history gives it, drawn with Markdown, images,
// timestamps (full date on hover), model and usage; the tree's controls on each message (edit a
// user message, regenerate a reply, "‹ 2/3 ›" between siblings, a label); compaction dividers whose
// summary can be opened; "show all" for texts history cut; and the streaming bubble of a run.
import { renderMarkdown } from "/webchat/js/markdown.js";
import { el, textOf, toMs, shortTime, fullTime, TRUNCATED } from "/webchat/js/util.js";

export class MessageView {
  /** actions: edit, regenerate, switchTo, showAll, summary, label, loadOlder, canChangeTree */
  constructor(log, actions) {
    this.log = log; this.actions = actions;
    this.messages = []; this.tree = null; this.streams = new Map(); this.hasOlder = false; this.readOnly = false;
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
    if (this.hasOlder) nodes.push(el("button", { type: "button", class: "older", "data-testid": "load-older", onclick: () => this.actions.loadOlder() }, "Load older messages"));
    for (const m of this.messages) nodes.push(this.renderOne(m));
    if (!this.messages.length) nodes.push(el("p", { class: "empty" }, this.readOnly ? "This transcript has no messages." : "No messages yet. Say hello."));
    for (const s of this.streams.values()) if (s.isConnected || s.dataset.run) nodes.push(s);
    this.log.replaceChildren(...nodes);
    this.scrollDown(true);
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
    if (msg.role === "assistant") {
      // The streaming bubble of its run becomes this message.
      const first = [...this.streams.entries()][0];
      if (first) { first[1].replaceWith(node); this.streams.delete(first[0]); this.scrollDown(); return; }
    }
    this.log.querySelector(".empty")?.remove();
    const firstStream = [...this.streams.values()][0];
    if (firstStream?.isConnected) firstStream.before(node); else this.log.append(node);
    this.scrollDown();
  }

  /** A `chat` delta: the accumulated text of the run's current message. */
  delta(runId, msg) {
    const text = textOf(msg);
    if (!text) return;
    let b = this.streams.get(runId);
    if (!b || !b.isConnected) {
      b = el("div", { class: "msg assistant streaming", "data-testid": "streaming", "data-run": runId }, el("div", { class: "body" }));
      this.streams.set(runId, b);
      this.log.querySelector(".empty")?.remove();
      this.log.append(b);
    }
    renderMarkdown(b.querySelector(".body"), text);
    this.scrollDown();
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
    const node = el("div", { class: `msg ${role}`, "data-testid": "message", "data-role": role, "data-entry-id": id });
    const body = el("div", { class: "body" });
    const text = textOf(m);
    if (role === "tool") body.textContent = text || "(tool result)";
    else {
      const calls = Array.isArray(m.content) ? m.content.filter((b) => b.type === "toolCall") : [];
      renderMarkdown(body, text + calls.map((c) => `\n\n\`⚙ ${c.name}\``).join(""));
      if (!text && !calls.length && m.stopReason !== "error") body.textContent = "…";
    }
    node.append(body);
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
    if (id && !this.readOnly) {
      if (role === "user") bits.append(el("button", { type: "button", class: "act", "data-testid": "edit", "aria-label": "Edit this message", disabled: !a.canChangeTree(), onclick: () => this.startEdit(m, id) }, "Edit"));
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
    const ta = el("textarea", { "aria-label": "Edited message", "data-testid": "edit-input" });
    ta.value = text;
    const cancel = () => this.draw();
    const save = () => { const t = ta.value; if (t.trim()) this.actions.edit(id, t); };
    ta.addEventListener("keydown", (e) => {
      if (e.key === "Escape") cancel();
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) { e.preventDefault(); save(); }
    });
    node.replaceChildren(el("div", { class: "edit-box" }, ta, el("div", { class: "btns" },
      el("button", { type: "button", onclick: cancel }, "Cancel"),
      el("button", { type: "button", class: "primary", "data-testid": "edit-save", onclick: save }, "Save & send"))));
    ta.focus();
  }

  renderCompaction(m, id) {
    const box = el("div", { class: "divider", "data-testid": "compaction-divider", "data-entry-id": id, role: "separator" });
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
}

function meta(m) { return m.__openclaw || {}; }
