// Approval cards: a tool call of the open chat waiting for a human (OpenClaw's
// exec.approval.requested, or exec.approval.list after connecting) shows a card with the command,
// its working directory, the tool and the reason, and Allow once / Always / Deny buttons that call
// exec.approval.resolve. A card goes when its decision is announced (from any client) or it expires.
import { el } from "/webchat/js/util.js";

export class Approvals {
  /** `box`: the element the cards go in; `resolve(id, decision)`: answers one (a promise);
   *  `onError(text)`: shows a failure. */
  constructor(box, { resolve, onError }) {
    this.box = box; this.resolve = resolve; this.onError = onError;
    this.all = new Map(); this.sessionKey = null; this.timers = new Map();
  }

  /** Every request waiting (exec.approval.list), replacing what was known. */
  set(list) {
    this.all.clear();
    for (const r of Array.isArray(list) ? list : []) if (r && r.id && r.request) this.all.set(r.id, r);
    this.render();
  }

  add(r) { if (r && r.id && r.request) { this.all.set(r.id, r); this.render(); } }

  remove(id) { if (this.all.delete(id)) this.render(); }

  setSession(key) { this.sessionKey = key; this.render(); }

  /** How many requests of the open chat wait. */
  get waiting() { return [...this.all.values()].filter((r) => r.request.sessionKey === this.sessionKey).length; }

  render() {
    const now = Date.now();
    for (const [id, r] of this.all) if (r.expiresAtMs && r.expiresAtMs <= now) this.all.delete(id);
    const mine = [...this.all.values()].filter((r) => r.request.sessionKey === this.sessionKey)
      .sort((a, b) => a.createdAtMs - b.createdAtMs);
    this.box.replaceChildren(...mine.map((r) => this.card(r)));
    this.box.hidden = mine.length === 0;
    for (const r of mine) {
      if (this.timers.has(r.id)) continue;
      this.timers.set(r.id, setTimeout(() => { this.timers.delete(r.id); this.render(); }, Math.max(0, r.expiresAtMs - now) + 250));
    }
  }

  card(r) {
    const q = r.request;
    const answer = (decision) => async (e) => {
      const buttons = e.target.closest("[data-testid=approval]").querySelectorAll("button");
      buttons.forEach((b) => { b.disabled = true; });
      try { await this.resolve(r.id, decision); this.remove(r.id); } catch (err) {
        this.onError(`The approval was not answered: ${err.message}`);
        if (/already|unknown or expired/.test(err.message)) this.remove(r.id); else buttons.forEach((b) => { b.disabled = false; });
      }
    };
    const mins = Math.max(0, Math.round((r.expiresAtMs - Date.now()) / 60000));
    return el("section", { class: "approval-card", "data-testid": "approval", "data-approval-id": r.id, "aria-label": "Approval needed" },
      el("div", { class: "approval-head" },
        el("strong", { text: "Waiting for your approval" }),
        el("span", { class: "approval-expiry", "data-testid": "approval-expiry", text: `expires in ${mins} min` })),
      el("dl", {},
        el("dt", { text: "Tool" }), el("dd", { class: "mono", "data-testid": "approval-tool", text: q.toolName || "bash" }),
        el("dt", { text: "Command" }), el("dd", {}, el("code", { "data-testid": "approval-command", text: q.command })),
        el("dt", { text: "Directory" }), el("dd", { class: "mono", "data-testid": "approval-cwd", text: q.cwd || "" }),
        el("dt", { text: "Reason" }), el("dd", { "data-testid": "approval-reason", text: q.reason || "This tool needs approval." })),
      el("div", { class: "approval-actions" },
        el("button", { type: "button", class: "primary", "data-testid": "approve-once", onclick: answer("allow-once") }, "Allow once"),
        el("button", { type: "button", "data-testid": "approve-always", title: "Always allow this command in this directory", onclick: answer("allow-always") }, "Always"),
        el("button", { type: "button", class: "deny", "data-testid": "approve-deny", onclick: answer("deny") }, "Deny")));
  }
}
