// The viewer inside a Pincer HTML export (crates/export/src/html.rs inlines it): reads the
// embedded JSONL (base64 in the element with id "pincer-session"), builds the id/parentId tree as Pi and
// OpenClaw read it (a `leaf` entry moves the active leaf to its targetId), and shows one branch at
// a time: every tip of the tree is listed and can be opened, `#entry=<id>` opens the branch holding
// that entry and scrolls to it, "User messages only" hides the rest. Markdown is rendered by marked
// and sanitized by DOMPurify (no scripts, handlers, styles, forms or frames); the page's CSP allows
// only its own inline scripts (by hash) and data: images, so nothing is fetched from anywhere.
(function () {
  "use strict";
  const vendor = globalThis.PincerVendor || {};
  const marked = new vendor.marked.Marked({ gfm: true, breaks: true, async: false });
  const DOMPurify = vendor.purify.default;
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      const href = node.getAttribute("href") || "";
      if (!/^(https?:|mailto:|#)/i.test(href)) node.removeAttribute("href");
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
    if (node.tagName === "IMG") {
      const src = node.getAttribute("src") || "";
      if (!/^data:image\/(png|jpeg|gif|webp);base64,/i.test(src)) node.removeAttribute("src");
    }
  });
  const PURIFY = {
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "iframe", "object", "embed", "svg", "math", "link", "meta", "base"],
    FORBID_ATTR: ["style", "srcset", "action", "formaction"],
    ALLOW_DATA_ATTR: false,
    RETURN_DOM_FRAGMENT: true,
  };

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    return e;
  }

  function markdown(text) {
    const box = el("div", { class: "md" });
    box.append(DOMPurify.sanitize(marked.parse(text || ""), PURIFY));
    return box;
  }

  // --- the embedded transcript ---
  const data = document.getElementById("pincer-session");
  const raw = atob((data.textContent || "").replace(/\s+/g, ""));
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  const jsonl = new TextDecoder("utf-8").decode(bytes);

  let header = null;
  const entries = [];
  for (const line of jsonl.split("\n")) {
    if (!line.trim()) continue;
    let v;
    try { v = JSON.parse(line); } catch { continue; }
    if (!v || typeof v !== "object" || Array.isArray(v)) continue;
    if (!header && entries.length === 0 && v.type === "session") { header = v; continue; }
    entries.push(v);
  }
  const byId = new Map();
  entries.forEach((e, i) => { if (typeof e.id === "string") { e.__i = i; byId.set(e.id, e); } });

  // Parents as OpenClaw reads them: a leaf control hangs under its target, and entries under a
  // leaf control continue from that target.
  function parentOf(e) {
    let p = e.type === "leaf" ? (e.targetId ?? null) : (e.parentId ?? null);
    let hops = 0;
    while (p && byId.get(p)?.type === "leaf" && hops++ < entries.length) p = byId.get(p).targetId ?? null;
    return p && byId.has(p) ? p : null;
  }
  const children = new Map();
  for (const e of entries) {
    if (typeof e.id !== "string" || e.type === "leaf") continue;
    e.__parent = parentOf(e);
    if (e.__parent) {
      if (!children.has(e.__parent)) children.set(e.__parent, []);
      children.get(e.__parent).push(e.id);
    }
  }
  const last = entries[entries.length - 1];
  let activeLeaf = null;
  if (last) activeLeaf = last.type === "leaf" ? (last.targetId ?? null) : (last.id ?? null);
  if (activeLeaf && byId.get(activeLeaf)?.type === "leaf") activeLeaf = parentOf(byId.get(activeLeaf));
  const chosen = data.getAttribute("data-leaf");
  const initialLeaf = chosen && byId.has(chosen) ? chosen : activeLeaf;

  const labels = new Map();
  for (const e of entries) {
    if (e.type !== "label" || typeof e.targetId !== "string") continue;
    const l = typeof e.label === "string" ? e.label.trim() : "";
    if (l) labels.set(e.targetId, l); else labels.delete(e.targetId);
  }

  function path(id) {
    const out = [];
    const seen = new Set();
    let cur = id ? byId.get(id) : null;
    while (cur && !seen.has(cur.id)) {
      seen.add(cur.id);
      out.push(cur);
      cur = cur.__parent ? byId.get(cur.__parent) : null;
    }
    return out.reverse();
  }
  const isTip = (e) => typeof e.id === "string" && e.type !== "leaf" && !(children.get(e.id) || []).length;
  const tips = entries.filter(isTip).sort((a, b) => (b.id === activeLeaf) - (a.id === activeLeaf) || b.__i - a.__i);

  // The tip a view of `id` ends at: the active leaf when `id` is on its path, else the newest tip below it.
  function tipFor(id) {
    if (path(activeLeaf).some((e) => e.id === id)) return activeLeaf;
    let best = byId.get(id);
    const stack = [id];
    while (stack.length) {
      const cur = stack.pop();
      for (const c of children.get(cur) || []) {
        const ce = byId.get(c);
        if (isTip(ce) && (!isTip(best) || ce.__i > best.__i)) best = ce;
        stack.push(c);
      }
    }
    return best ? best.id : id;
  }

  function text(content) {
    if (typeof content === "string") return content;
    if (!Array.isArray(content)) return "";
    return content.filter((b) => b && b.type === "text" && typeof b.text === "string").map((b) => b.text).join("");
  }
  function oneLine(s, max) {
    const t = (s || "").replace(/\s+/g, " ").trim();
    return t.length > max ? t.slice(0, max - 1) + "…" : t;
  }
  function headline(tip) {
    const p = path(tip);
    for (let i = p.length - 1; i >= 0; i--) {
      const m = p[i].type === "message" ? p[i].message : null;
      if (m && (m.role === "user" || m.role === "assistant")) {
        const t = oneLine(text(m.content), 80);
        if (t) return t;
      }
    }
    return "(no messages)";
  }
  function when(e) {
    const t = Date.parse(e.timestamp || "");
    return Number.isFinite(t) ? new Date(t).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC") : "";
  }
  function image(b) {
    const mime = String(b.mimeType || "");
    const d = String(b.data || "");
    if (!/^image\/(png|jpeg|gif|webp)$/.test(mime) || !/^[A-Za-z0-9+/=\s]*$/.test(d)) return el("span", { class: "muted" }, `[image: ${mime}]`);
    return el("img", { class: "image", alt: "image", src: `data:${mime};base64,${d.replace(/\s+/g, "")}` });
  }
  function pre(s, cls) { return el("pre", { class: cls || "" }, el("code", {}, s)); }

  function blocks(content, asMarkdown) {
    if (typeof content === "string") return [asMarkdown ? markdown(content) : pre(content)];
    if (!Array.isArray(content)) return [];
    return content.map((b) => {
      if (!b || typeof b !== "object") return null;
      switch (b.type) {
        case "text": return asMarkdown ? markdown(b.text) : pre(String(b.text || ""));
        case "thinking": return b.thinking ? el("details", { class: "thinking" }, el("summary", {}, "Thinking"), pre(String(b.thinking))) : null;
        case "image": return image(b);
        case "toolCall": return el("div", { class: "tool-call", "data-testid": "tool-call" },
          el("div", { class: "tool-name" }, `Tool call: ${b.name || "?"}`, el("span", { class: "muted" }, ` ${b.id || ""}`)),
          pre(JSON.stringify(b.arguments ?? {}, null, 2)));
        default: return null;
      }
    });
  }

  function card(e, kind, title, body) {
    const id = e.id;
    const label = labels.get(id);
    return el("article", { class: `entry ${kind}`, id: `entry-${id}`, "data-entry-id": id, "data-kind": kind },
      el("header", {},
        el("span", { class: "role" }, title),
        label ? el("span", { class: "label", "data-testid": "label" }, label) : null,
        el("span", { class: "time" }, when(e)),
        el("a", { class: "anchor", href: `#entry=${encodeURIComponent(id)}`, title: "Link to this entry" }, "#")),
      el("div", { class: "body" }, body));
  }

  function render(e) {
    if (e.type === "message") {
      const m = e.message || {};
      switch (m.role) {
        case "user": return card(e, "user", "User", blocks(m.content, true));
        case "assistant": {
          const model = [m.provider, m.model].filter(Boolean).join("/");
          return card(e, "assistant", model ? `Assistant · ${model}` : "Assistant",
            [blocks(m.content, true), m.errorMessage ? el("div", { class: "error" }, `Error: ${m.errorMessage}`) : null]);
        }
        case "toolResult": return card(e, "tool-result", `Tool result: ${m.toolName || "?"}${m.isError ? " (error)" : ""}`, blocks(m.content, false));
        case "bashExecution": return card(e, "tool-result", "Shell", [pre(String(m.command || "")), pre(String(m.output || ""))]);
        case "branchSummary": return card(e, "summary", "Branch summary", markdown(m.summary));
        case "compactionSummary": return card(e, "summary", "Compaction summary", markdown(m.summary));
        default: return card(e, "other", String(m.role || "message"), blocks(m.content, true));
      }
    }
    switch (e.type) {
      case "compaction": return card(e, "compaction", `Compaction${e.tokensBefore ? ` · ${e.tokensBefore} tokens before` : ""}`, markdown(e.summary));
      case "branch_summary": return card(e, "summary", "Branch summary", markdown(e.summary));
      case "custom_message": return e.display === false ? null : card(e, "other", `Custom · ${e.customType || ""}`, blocks(e.content, true));
      case "model_change": return card(e, "meta", "Model", `${e.provider || "?"}/${e.modelId || "?"}`);
      case "thinking_level_change": return card(e, "meta", "Thinking level", String(e.thinkingLevel || ""));
      default: return null;
    }
  }

  // --- the page ---
  const app = document.getElementById("app");
  const userOnly = el("input", { type: "checkbox", id: "user-only", "data-testid": "user-only" });
  const branchList = el("ol", { class: "branches", "data-testid": "branches" });
  const thread = el("main", { class: "thread", "data-testid": "thread" });
  const info = el("div", { class: "info" });
  const download = el("button", { type: "button", "data-testid": "download-jsonl" }, "Download JSONL");
  download.addEventListener("click", () => {
    const a = el("a", { href: URL.createObjectURL(new Blob([bytes], { type: "application/x-ndjson" })), download: `${header?.id || "session"}.jsonl` });
    document.body.append(a); a.click(); a.remove();
  });
  const name = document.title;
  app.append(
    el("aside", { class: "side" },
      el("h1", {}, name),
      info,
      el("label", { class: "filter" }, userOnly, " User messages only"),
      el("h2", {}, `Branches (${tips.length})`),
      branchList,
      download),
    thread);
  info.append(
    el("div", {}, `Session ${header?.id || "?"}`),
    header?.timestamp ? el("div", {}, `Started ${when(header)}`) : null,
    el("div", {}, `${entries.length} entries`));
  userOnly.addEventListener("change", () => document.body.classList.toggle("only-user", userOnly.checked));

  let shown = null;
  for (const t of tips) {
    const b = el("button", { type: "button", class: "branch", "data-tip": t.id, "data-testid": "branch" },
      el("span", { class: "headline" }, headline(t.id)),
      el("span", { class: "muted" }, `${path(t.id).length} entries${t.id === activeLeaf ? " · active" : ""}`));
    b.addEventListener("click", () => show(t.id, null));
    branchList.append(el("li", {}, b));
  }

  // A long branch is drawn WINDOW entries at a time, from its end ("Show earlier" / "Show later"
  // add more); a deep link to an entry outside the window moves the window to it.
  const WINDOW = 400;
  let from = 0, to = 0;
  function draw(p) {
    const earlier = from > 0
      ? el("button", { type: "button", class: "earlier", "data-testid": "show-earlier", onclick: () => { from = Math.max(0, from - WINDOW); draw(p); } },
        `Show ${Math.min(WINDOW, from)} earlier entries (${from} not shown)`)
      : null;
    const later = to < p.length
      ? el("button", { type: "button", class: "earlier", "data-testid": "show-later", onclick: () => { to = Math.min(p.length, to + WINDOW); draw(p); } },
        `Show ${Math.min(WINDOW, p.length - to)} later entries (${p.length - to} not shown)`)
      : null;
    thread.replaceChildren(...[earlier, ...p.slice(from, to).map(render), later].filter(Boolean));
    if (!p.length) thread.append(el("p", { class: "muted" }, "This branch has no messages."));
  }
  function show(tip, target) {
    const p = path(tip);
    const at = target ? p.findIndex((e) => e.id === target) : -1;
    if (shown !== tip || (at >= 0 && (at < from || at >= to))) {
      if (shown !== tip) { from = Math.max(0, p.length - WINDOW); to = p.length; }
      if (at >= 0 && (at < from || at >= to)) { from = Math.max(0, at - 20); to = Math.min(p.length, from + WINDOW); }
      shown = tip;
      draw(p);
      for (const b of branchList.querySelectorAll(".branch")) b.classList.toggle("current", b.dataset.tip === tip);
    }
    for (const t of thread.querySelectorAll(".target")) t.classList.remove("target");
    if (target) {
      const node = document.getElementById(`entry-${target}`);
      if (node) { node.classList.add("target"); node.scrollIntoView({ block: "center" }); }
    }
  }

  function fromHash() {
    const m = /^#entry=(.+)$/.exec(location.hash);
    const id = m ? decodeURIComponent(m[1]) : null;
    if (id && byId.has(id)) show(tipFor(id), id);
    else if (!shown) show(initialLeaf, null);
  }
  window.addEventListener("hashchange", fromHash);
  fromHash();
  document.body.setAttribute("data-ready", "true");
})();
