// The sessions sidebar: chats with their title (label, else the first user message), relative
// date and message count; new, open, rename (label), export (HTML, Markdown or JSONL), archive,
// delete; and "Archived": archived chats (restorable) and transcripts moved aside by /new, reset
// and delete (read-only view).
import { el, icon, relTime, fullTime } from "/webchat/js/util.js";

export function titleOf(row) {
  return (row.label || row.displayName || row.derivedTitle || "").trim() || "New chat";
}

export class Sidebar {
  /** actions: open(key), rename(key, label), exportAs(key, format), archive(key, bool), remove(key), viewArchive(file) */
  constructor({ list, archivedList, archiveFiles, actions }) {
    Object.assign(this, { list, archivedList, archiveFiles, actions });
    this.rows = []; this.archives = []; this.current = null; this.viewing = null; this.exporting = null;
  }

  set(rows, archives) { this.rows = rows; this.archives = archives; this.draw(); }
  setCurrent(key, viewing = null) { this.current = key; this.viewing = viewing; this.draw(); }
  row(key) { return this.rows.find((r) => r.key === key); }

  draw() {
    const live = this.rows.filter((r) => !r.archivedAt);
    const archived = this.rows.filter((r) => r.archivedAt);
    if (this.current && !this.rows.some((r) => r.key === this.current)) live.unshift({ key: this.current, updatedAt: Date.now(), messageCount: 0 });
    this.list.replaceChildren(...live.map((r) => this.rowNode(r, false)));
    this.archivedList.replaceChildren(...archived.map((r) => this.rowNode(r, true)));
    this.archiveFiles.replaceChildren(...this.archives.map((a) => el("li", { class: `session-row${this.viewing === a.file ? " current" : ""}`, "data-testid": "archive-file", "data-file": a.file },
      el("button", { type: "button", class: "open", onclick: () => this.actions.viewArchive(a) },
        el("span", { class: "name" }, a.title || "(no messages)"),
        el("span", { class: "sub", title: fullTime(a.archivedAt) }, `${a.reason === "deleted" ? "deleted" : "ended by /new or reset"} · ${relTime(a.archivedAt)} · ${a.messageCount} messages`)))));
  }

  rowNode(r, archived) {
    const a = this.actions;
    const current = r.key === this.current && !this.viewing;
    const count = typeof r.messageCount === "number" ? ` · ${r.messageCount} message${r.messageCount === 1 ? "" : "s"}` : "";
    const li = el("li", { class: `session-row${current ? " current" : ""}`, "data-testid": "session-row", "data-key": r.key, "data-archived": archived ? "true" : "false" });
    const open = el("button", { type: "button", class: "open", "aria-current": current ? "page" : null, onclick: () => a.open(r.key) },
      el("span", { class: "name", "data-testid": "session-title" }, titleOf(r)),
      el("span", { class: "sub", title: fullTime(r.updatedAt) }, `${relTime(r.updatedAt)}${count}`));
    const actions = el("span", { class: "actions" },
      el("button", { type: "button", "data-testid": "rename", "aria-label": `Rename ${titleOf(r)}`, title: "Rename", onclick: () => this.startRename(li, r) }, icon("pencil")),
      el("button", { type: "button", "data-testid": "export", "aria-label": `Export ${titleOf(r)}`, title: "Export", onclick: () => this.startExport(li, r) }, icon("download")),
      archived
        ? el("button", { type: "button", "data-testid": "restore", "aria-label": `Restore ${titleOf(r)}`, title: "Restore", onclick: () => a.archive(r.key, false) }, icon("restore"))
        : el("button", { type: "button", "data-testid": "archive", "aria-label": `Archive ${titleOf(r)}`, title: "Archive", onclick: () => a.archive(r.key, true) }, icon("archive")),
      r.key === "agent:main:main" ? null : el("button", { type: "button", "data-testid": "delete", "aria-label": `Delete ${titleOf(r)}`, title: "Delete", onclick: () => {
        if (confirm(`Delete "${titleOf(r)}"? Its transcript is kept on disk as an archive.`)) a.remove(r.key);
      } }, icon("trash")));
    li.append(open, this.exporting === r.key ? this.exportMenu(r) : actions);
    return li;
  }

  /** The export formats in place of the row's actions (kept when the list is redrawn); one click
   *  downloads the file. */
  startExport(li, r) {
    this.exporting = r.key;
    li.querySelector(".actions").replaceWith(this.exportMenu(r));
    li.querySelector(".export-menu button").focus();
  }

  exportMenu(r) {
    const done = () => { this.exporting = null; this.draw(); };
    const pick = (format) => { done(); this.actions.exportAs(r.key, format); };
    return el("span", { class: "export-menu", role: "group", "aria-label": `Export ${titleOf(r)} as` },
      el("button", { type: "button", "data-testid": "export-html", title: "One page with the whole tree", onclick: () => pick("html") }, "HTML"),
      el("button", { type: "button", "data-testid": "export-md", title: "The active branch as Markdown", onclick: () => pick("md") }, "Markdown"),
      el("button", { type: "button", "data-testid": "export-jsonl", title: "The transcript file", onclick: () => pick("jsonl") }, "JSONL"),
      el("button", { type: "button", class: "icon", "aria-label": "Cancel", onclick: done }, "✕"));
  }

  startRename(li, r) {
    const input = el("input", { type: "text", "aria-label": "New name", "data-testid": "rename-input", maxlength: "256" });
    input.value = r.label || titleOf(r);
    let done = false;
    const finish = (save) => {
      if (done) return; done = true;
      if (save && input.value.trim() !== (r.label || "")) this.actions.rename(r.key, input.value.trim());
      else this.draw();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.isComposing) { e.preventDefault(); finish(true); }
      if (e.key === "Escape") { e.preventDefault(); finish(false); }
    });
    input.addEventListener("blur", () => finish(true));
    li.replaceChildren(input);
    input.focus(); input.select();
  }
}
