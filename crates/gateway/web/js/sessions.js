// The sessions sidebar: every chat, paged in as the list scrolls (sessions.list by offset), grouped
// by date, each with its title (label, else the first user message as plain text), relative date and
// message count; the open chat always shown (fetched alone when it is not in the pages loaded). One
// tab stop for the list (arrow keys move between rows, → or the ⋯ button opens a row's menu: rename
// — saved on Enter only —, export as HTML, Markdown or JSONL, archive or restore, delete). "Archived"
// pages through the archived chats alone, and lists the transcripts moved aside by /new, reset and
// delete (read-only view). Each row is a link to the chat's address, so it opens in a new tab too.
import { el, relTime, fullTime } from "/webchat/js/util.js";

/** Rows fetched per sessions.list page. */
const PAGE = 100;
/** sessions.list answers at most this many rows at once. */
const MAX_ROWS = 1000;
const MAIN = "agent:main:main";

/** A first message as a title: one line of plain text, without Markdown marks; a slash command is no title. */
export function plainTitle(text) {
  let t = String(text || "");
  t = t.replace(/```[\s\S]*?(```|$)/g, " ").replace(/!\[([^\]]*)\]\([^)]*\)/g, "$1").replace(/\[([^\]]*)\]\([^)]*\)/g, "$1");
  t = t.replace(/^\s{0,3}(#{1,6}\s+|>\s?|[-*+]\s+|\d+[.)]\s+)/gm, "").replace(/(\*\*|__|~~|`)/g, "").replace(/(^|\s)[*_](\S[^*_]*)[*_](?=\s|$)/g, "$1$2");
  t = t.replace(/\s+/g, " ").trim();
  if (/^\/[a-z][\w-]*(\s|$)/i.test(t)) return "";
  return t.length > 120 ? `${t.slice(0, 119)}…` : t;
}

export function titleOf(row) {
  return (row.label || row.displayName || "").trim() || plainTitle(row.derivedTitle) || "New chat";
}

/** The address of a chat (the page reads `#chat=` on load and on Back/Forward). */
export function chatHref(key) {
  return `#chat=${key.split(":").map(encodeURIComponent).join(":")}`;
}

/** The date group of a row: Today, Yesterday, Previous 7 days, Previous 30 days, then month and year. */
function groupOf(ms, now = new Date()) {
  if (!ms) return "Older";
  const day = new Date(now.getFullYear(), now.getMonth(), now.getDate()).getTime();
  if (ms >= day) return "Today";
  if (ms >= day - 86400e3) return "Yesterday";
  if (ms >= day - 7 * 86400e3) return "Previous 7 days";
  if (ms >= day - 30 * 86400e3) return "Previous 30 days";
  return new Date(ms).toLocaleDateString([], { month: "long", year: "numeric" });
}

/** One paged list: the rows loaded so far and whether the server has more. */
class Pages {
  constructor(onlyArchived) { this.onlyArchived = onlyArchived; this.rows = []; this.more = true; this.loading = null; }
}

export class Sidebar {
  /**
   * list(params) → a sessions.list answer; actions: open(key), rename(key, label), exportAs(key, format),
   * archive(key, bool), remove(key), viewArchive(file)
   */
  constructor({ list, archivedList, archiveFiles, archivedBox, fetchPage, actions }) {
    Object.assign(this, { list, archivedList, archiveFiles, archivedBox, fetchPage, actions });
    this.live = new Pages(false); this.arch = new Pages(true);
    this.archives = []; this.current = null; this.viewing = null; this.extra = null;
    this.menu = null; this.renaming = null; this.deferred = false;
    this.observer = new IntersectionObserver((entries) => {
      for (const e of entries) if (e.isIntersecting) this.more(e.target.dataset.pages === "archived" ? this.arch : this.live);
    }, { root: null, rootMargin: "200px" });
    for (const ul of [list, archivedList]) ul.addEventListener("keydown", (e) => this.onKey(e));
    document.addEventListener("click", (e) => {
      if (this.menu && !e.target.closest?.(".row-menu, .more")) this.closeMenu(false);
    });
  }

  /** Reloads what is loaded (from the top, as many rows as before), so offsets stay those of the server's list. */
  async refresh() {
    await Promise.all([this.reload(this.live), this.reload(this.arch)]);
    this.draw();
  }

  async reload(p) {
    const limit = Math.min(Math.max(p.rows.length, PAGE), MAX_ROWS);
    const r = await this.fetchPage({ offset: 0, limit, onlyArchived: p.onlyArchived });
    const fresh = r.sessions;
    const keys = new Set(fresh.map((x) => x.key));
    // Rows past the first 1,000 stay as they were (paged in again only when scrolled to).
    const past = p.rows.slice(limit).filter((x) => !keys.has(x.key));
    p.rows = fresh.concat(past);
    if (!past.length) p.more = !!r.hasMore;
  }

  /** The next page of `p` (one at a time). */
  more(p) {
    if (!p.more || p.loading) return p.loading;
    p.loading = this.fetchPage({ offset: p.rows.length, limit: PAGE, onlyArchived: p.onlyArchived }).then((r) => {
      const have = new Set(p.rows.map((x) => x.key));
      p.rows.push(...r.sessions.filter((x) => !have.has(x.key)));
      p.more = !!r.hasMore && r.sessions.length > 0;
      this.draw();
    }, () => {
      // Not drawn again (that would ask again at once): the end of the list asks again when it
      // scrolls back into view, or the list is reloaded after a reconnect.
    }).finally(() => { p.loading = null; });
    return p.loading;
  }

  setArchives(archives) { this.archives = archives; this.draw(); }
  /** The open chat's row when it is in no page loaded (sessions.describe), or null. */
  setExtra(row) { this.extra = row; this.draw(); }
  setCurrent(key, viewing = null) { this.current = key; this.viewing = viewing; this.draw(); }
  row(key) { return this.live.rows.find((r) => r.key === key) || this.arch.rows.find((r) => r.key === key) || (this.extra?.key === key ? this.extra : undefined); }
  loaded(key) { return this.live.rows.some((r) => r.key === key) || this.arch.rows.some((r) => r.key === key); }

  draw() {
    // Not while a menu or a rename is open: that would close it under the user's hands.
    if (this.menu || this.renaming) { this.deferred = true; return; }
    this.deferred = false;
    this.observer.disconnect();
    const focused = document.activeElement?.closest?.(".session-row")?.dataset.key;
    const nodes = [];
    const pinned = this.current && !this.viewing && !this.loaded(this.current)
      ? (this.extra?.key === this.current ? this.extra : { key: this.current, label: "…" }) : null;
    if (pinned) nodes.push(this.group("Open chat"), this.rowNode(pinned, !!pinned.archivedAt));
    let last = null;
    for (const r of this.live.rows) {
      const g = groupOf(r.updatedAt);
      if (g !== last) { nodes.push(this.group(g)); last = g; }
      nodes.push(this.rowNode(r, false));
    }
    if (this.live.more) nodes.push(this.sentinel("live"));
    this.list.replaceChildren(...nodes);
    this.archivedList.replaceChildren(...this.arch.rows.map((r) => this.rowNode(r, true)), ...(this.arch.more ? [this.sentinel("archived")] : []));
    this.archiveFiles.replaceChildren(...this.archives.map((a) => el("li", { class: `session-row${this.viewing === a.file ? " current" : ""}`, "data-testid": "archive-file", "data-file": a.file },
      el("button", { type: "button", class: "open", tabindex: "-1", onclick: () => this.actions.viewArchive(a) },
        el("span", { class: "name" }, a.title ? plainTitle(a.title) || a.title : "(no messages)"),
        el("span", { class: "sub", title: fullTime(a.archivedAt) }, `${a.reason === "deleted" ? "deleted" : "ended by /new or reset"} · ${relTime(a.archivedAt)} · ${a.messageCount} messages`)))));
    this.rove(focused);
  }

  group(label) { return el("li", { class: "group", role: "presentation" }, label); }

  sentinel(which) {
    const li = el("li", { class: "sentinel", role: "presentation", "data-pages": which, "data-testid": "list-more" }, "Loading more…");
    queueMicrotask(() => this.observer.observe(li));
    return li;
  }

  /** One tab stop per list: the open chat's row, else the first; the focus stays on the row it was on. */
  rove(focusKey) {
    for (const ul of [this.list, this.archivedList, this.archiveFiles]) {
      const links = [...ul.querySelectorAll(".session-row > .open")];
      const pick = links.find((a) => a.closest(".session-row").classList.contains("current")) || links[0];
      for (const a of links) a.tabIndex = a === pick ? 0 : -1;
    }
    if (focusKey && (document.activeElement === document.body || !document.activeElement)) this.focusRow(focusKey);
  }

  onKey(e) {
    const row = e.target.closest(".session-row");
    if (!row || e.target.closest(".row-menu") || e.target.tagName === "INPUT") return;
    const rows = [...e.currentTarget.querySelectorAll(".session-row")];
    const i = rows.indexOf(row);
    const go = (j) => {
      const next = rows[Math.max(0, Math.min(rows.length - 1, j))];
      if (!next) return;
      e.preventDefault();
      for (const a of e.currentTarget.querySelectorAll(".session-row > .open")) a.tabIndex = -1;
      const link = next.querySelector(".open");
      link.tabIndex = 0; link.focus();
      next.scrollIntoView({ block: "nearest" });
    };
    if (e.key === "ArrowDown") go(i + 1);
    else if (e.key === "ArrowUp") go(i - 1);
    else if (e.key === "Home") go(0);
    else if (e.key === "End") go(rows.length - 1);
    else if ((e.key === "ArrowRight" || e.key === "ContextMenu" || (e.key === "F10" && e.shiftKey)) && row.dataset.key) {
      e.preventDefault();
      this.openMenu(row.dataset.key);
    }
  }

  rowNode(r, archived) {
    const current = r.key === this.current && !this.viewing;
    const count = typeof r.messageCount === "number" ? ` · ${r.messageCount} message${r.messageCount === 1 ? "" : "s"}` : "";
    const title = titleOf(r);
    const li = el("li", { class: `session-row${current ? " current" : ""}`, "data-testid": "session-row", "data-key": r.key, "data-archived": archived ? "true" : "false" });
    const open = el("a", { class: "open", href: chatHref(r.key), tabindex: "-1", "aria-current": current ? "page" : null, title,
      onclick: (e) => {
        if (e.button !== 0 || e.ctrlKey || e.metaKey || e.shiftKey || e.altKey) return; // a new tab or window
        e.preventDefault();
        this.actions.open(r.key, e.detail === 0); // detail 0: Enter on the focused row

      } },
    el("span", { class: "name", "data-testid": "session-title" }, title),
    el("span", { class: "sub", title: fullTime(r.updatedAt) }, `${r.updatedAt ? relTime(r.updatedAt) : ""}${r.updatedAt ? count : count.replace(/^ · /, "")}`));
    const more = el("button", { type: "button", class: "more", tabindex: "-1", "data-testid": "row-menu", "aria-haspopup": "menu",
      "aria-expanded": "false", "aria-label": `Actions for ${title}`, title: "Rename, export, archive, delete",
      onclick: (e) => { e.stopPropagation(); this.menu?.key === r.key ? this.closeMenu(true) : this.openMenu(r.key); } }, "⋯");
    li.append(open, more);
    return li;
  }

  openMenu(key, mode = "main") {
    const r = this.row(key) || { key };
    const li = [...document.querySelectorAll(".session-row")].find((x) => x.dataset.key === key);
    if (!li) return;
    document.querySelector(".row-menu")?.remove();
    this.menu = { key, mode };
    const archived = li.dataset.archived === "true";
    const title = titleOf(r);
    const item = (testid, text, fn, extra = {}) => el("button", { type: "button", role: "menuitem", tabindex: "-1", "data-testid": testid, ...extra,
      onclick: (e) => { e.stopPropagation(); fn(); } }, text);
    const a = this.actions;
    const done = (fn) => () => { this.closeMenu(false); fn(); };
    const items = mode === "export"
      ? [item("export-html", "Export as HTML", done(() => a.exportAs(key, "html")), { title: "One page with the whole tree" }),
        item("export-md", "Export as Markdown", done(() => a.exportAs(key, "md")), { title: "The active branch as Markdown" }),
        item("export-jsonl", "Export as JSONL", done(() => a.exportAs(key, "jsonl")), { title: "The transcript file" }),
        item("export-cancel", "Back", () => this.openMenu(key, "main"))]
      : [item("rename", "Rename", () => { this.closeMenu(false); this.startRename(key); }),
        item("export", "Export…", () => this.openMenu(key, "export")),
        archived ? item("restore", "Restore", done(() => a.archive(key, false))) : item("archive", "Archive", done(() => a.archive(key, true))),
        key === MAIN ? null : item("delete", "Delete…", done(() => {
          if (confirm(`Delete "${title}"? Its transcript is kept on disk as an archive.`)) a.remove(key);
        }), { class: "danger" })].filter(Boolean);
    const menu = el("div", { class: "row-menu", role: "menu", "aria-label": mode === "export" ? `Export ${title} as` : `Actions for ${title}`, "data-testid": "row-menu-items" }, ...items);
    menu.addEventListener("keydown", (e) => {
      const list = [...menu.querySelectorAll("[role=menuitem]")];
      const i = list.indexOf(document.activeElement);
      if (e.key === "ArrowDown") { e.preventDefault(); list[(i + 1) % list.length].focus(); }
      else if (e.key === "ArrowUp") { e.preventDefault(); list[(i - 1 + list.length) % list.length].focus(); }
      else if (e.key === "Escape" || e.key === "ArrowLeft" || e.key === "Tab") { e.preventDefault(); e.stopPropagation(); this.closeMenu(true); }
    });
    li.append(menu);
    li.querySelector(".more")?.setAttribute("aria-expanded", "true");
    li.classList.add("menu-open");
    items[0].focus();
  }

  /** Closes the row menu; `refocus` puts the focus back on its row. */
  closeMenu(refocus) {
    if (!this.menu) return;
    const key = this.menu.key;
    this.menu = null;
    document.querySelector(".row-menu")?.remove();
    for (const li of document.querySelectorAll(".session-row.menu-open")) { li.classList.remove("menu-open"); li.querySelector(".more")?.setAttribute("aria-expanded", "false"); }
    if (this.deferred) this.draw();
    if (refocus) this.focusRow(key);
  }

  focusRow(key) {
    const li = [...document.querySelectorAll(".session-row")].find((x) => x.dataset.key === key);
    const link = li?.querySelector(".open");
    if (!link) return;
    for (const a of li.parentElement.querySelectorAll(".session-row > .open")) a.tabIndex = -1;
    link.tabIndex = 0; link.focus();
  }

  /** Rename in place: Enter saves, Escape or leaving the field keeps the old name. */
  startRename(key) {
    this.renaming = null;
    this.draw();
    const li = [...this.list.querySelectorAll(".session-row"), ...this.archivedList.querySelectorAll(".session-row")].find((x) => x.dataset.key === key);
    const r = this.row(key);
    if (!li || !r) return;
    this.renaming = key;
    li.replaceChildren(this.renameBox(r));
    const input = li.querySelector("input");
    input.focus(); input.select();
  }

  renameBox(r) {
    const input = el("input", { type: "text", "aria-label": `New name for ${titleOf(r)} (Enter saves, Escape cancels)`, "data-testid": "rename-input", maxlength: "256" });
    input.value = r.label || titleOf(r);
    let done = false;
    const finish = (save) => {
      if (done) return; done = true;
      this.renaming = null;
      const v = input.value.trim();
      if (save && v !== (r.label || "") && v !== titleOf(r)) {
        r.label = v || undefined; // shown at once, in its place; the gateway's answer follows
        this.actions.rename(r.key, v);
      }
      this.draw();
      this.focusRow(r.key);
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.isComposing) { e.preventDefault(); finish(true); }
      if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); finish(false); }
    });
    input.addEventListener("blur", () => finish(false));
    return input;
  }
}
