// The outbox: every message typed stays here (and in localStorage, so a reload or a crash keeps
// it) until the gateway acknowledged its chat.send. Each item has one idempotencyKey for its whole
// life, so a retry after a lost answer, a reconnect or a gateway restart can never write it twice.
// Items are sent one at a time per session, and only while that session has no run streaming.
import { el, store, uuid } from "/webchat/js/util.js";

const KEY = "pincer.outbox";

export class Outbox {
  /**
   * send(item) → Promise of chat.send's answer; canSend(item) → whether it may go now;
   * onChange() after any change (to re-render).
   */
  constructor({ send, canSend, onChange, onError }) {
    Object.assign(this, { send, canSend, onChange, onError });
    this.items = store.getJSON(KEY, []).filter((i) => i && i.key && i.sessionKey);
    for (const i of this.items) if (i.state === "sending") i.state = "queued";
    this.inFlight = new Set();
    this.unsaved = false;
  }

  save() {
    // Attachments can be too large for localStorage: then at least the text is kept.
    this.unsaved = !store.setJSON(KEY, this.items) && !store.setJSON(KEY, this.items.map((i) => ({ ...i, attachments: undefined, attachmentsLost: !!i.attachments })));
    this.onChange();
  }

  /** Queues a message; returns its item. */
  add({ sessionKey, text, attachments, expectedLeafEntryId }) {
    const item = { key: uuid(), sessionKey, text, createdAt: Date.now(), state: "queued" };
    if (attachments?.length) item.attachments = attachments;
    if (expectedLeafEntryId !== undefined) item.expectedLeafEntryId = expectedLeafEntryId;
    this.items.push(item);
    this.save();
    this.flush();
    return item;
  }

  of(sessionKey) { return this.items.filter((i) => i.sessionKey === sessionKey); }

  remove(key) { this.items = this.items.filter((i) => i.key !== key); this.save(); }

  /** Sends what may go now: the first queued item of each session. */
  flush() {
    const firsts = new Map();
    for (const i of this.items) if (!firsts.has(i.sessionKey)) firsts.set(i.sessionKey, i);
    for (const item of firsts.values()) {
      if (item.state !== "queued" || this.inFlight.has(item.key) || !this.canSend(item)) continue;
      this.sendOne(item);
    }
  }

  async sendOne(item) {
    this.inFlight.add(item.key);
    item.state = "sending"; this.onChange();
    try {
      await this.send(item);
      this.items = this.items.filter((i) => i.key !== item.key);
      this.save();
    } catch (e) {
      if (e.transport) {
        item.state = "queued";          // not answered: the same key goes again on reconnect
      } else {
        item.state = "failed"; item.error = e.message;
        this.onError(item, e);
      }
      this.save();
    } finally {
      this.inFlight.delete(item.key);
    }
    this.flush();
  }

  retry(key) {
    const i = this.items.find((x) => x.key === key);
    if (i) { i.state = "queued"; delete i.error; this.save(); this.flush(); }
  }

  /** Renders the items of one session into `list`. */
  render(list, sessionKey) {
    list.replaceChildren(...this.of(sessionKey).map((i) => el("li", {
      class: i.state, "data-testid": "outbox-item", "data-key": i.key, "data-state": i.state },
    el("span", { class: "txt" }, i.text || (i.attachments ? `[${i.attachments.length} image(s)]` : "")),
    el("span", { class: "state" }, i.state === "failed" ? `not sent: ${i.error}` : i.state === "sending" ? "sending…" : "waiting to send"),
    i.attachmentsLost ? el("span", { class: "state" }, "(images too large to keep across a reload)") : null,
    i.state === "failed" ? el("button", { type: "button", "data-testid": "outbox-retry", onclick: () => this.retry(i.key) }, "Retry") : null,
    i.state !== "sending" ? el("button", { type: "button", "data-testid": "outbox-discard", "aria-label": "Discard this message",
      onclick: () => { if (confirm("Discard this unsent message?")) this.remove(i.key); } }, "Discard") : null)));
  }
}
