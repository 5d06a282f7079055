// The gateway connection: the WebSocket handshake (connect.challenge → connect with the token),
// requests with ids and promises, events to listeners, reconnects with backoff, and gap detection
// by the frames' `seq` (a gap asks for a refetch).

export class Gateway {
  constructor({ onEvent, onOpen, onClose, onAuthError }) {
    Object.assign(this, { onEvent, onOpen, onClose, onAuthError });
    this.ws = null; this.token = null; this.connected = false; this.nextId = 1;
    this.pending = new Map(); this.backoff = 500; this.lastSeq = 0; this.timer = null; this.everConnected = false;
  }

  /** Opens (or reopens) the socket with `token`. */
  connect(token) {
    this.token = token;
    clearTimeout(this.timer);
    if (this.ws) { const old = this.ws; this.ws = null; old.onclose = null; old.close(); this.dropPending("reconnecting"); }
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/";
    const ws = new WebSocket(url);
    this.ws = ws; this.lastSeq = 0;
    ws.onmessage = (e) => this.onFrame(ws, e.data);
    ws.onclose = () => {
      if (this.ws !== ws) return;
      const was = this.connected;
      this.connected = false; this.ws = null;
      this.dropPending("connection closed");
      this.onClose(was);
      if (!this.token) return;
      this.timer = setTimeout(() => this.connect(this.token), this.backoff);
      this.backoff = Math.min(this.backoff * 2, 8000);
    };
  }

  dropPending(why) {
    for (const p of this.pending.values()) p.reject(Object.assign(new Error(why), { transport: true }));
    this.pending.clear();
  }

  onFrame(ws, data) {
    let f; try { f = JSON.parse(data); } catch { return; }
    if (f.type === "event" && f.event === "connect.challenge") {
      ws.send(JSON.stringify({ type: "req", id: "connect", method: "connect", params: {
        minProtocol: 3, maxProtocol: 4,
        client: { id: "webchat-ui", version: "pincer", platform: navigator.platform || "web", mode: "webchat" },
        role: "operator", scopes: ["operator.read", "operator.write", "operator.approvals"], auth: { token: this.token } } }));
      return;
    }
    if (f.type === "res" && f.id === "connect") {
      if (!f.ok) {
        const code = f.error?.details?.code || "";
        this.onAuthError(f.error?.message || "unknown error", code);
        if (code.startsWith("AUTH")) { this.token = null; ws.close(); }
        return;
      }
      this.connected = true; this.backoff = 500;
      const again = this.everConnected; this.everConnected = true;
      this.onOpen(again);
      return;
    }
    if (f.type === "res") {
      const p = this.pending.get(f.id); if (!p) return;
      this.pending.delete(f.id);
      if (f.ok) p.resolve(f.payload);
      else p.reject(Object.assign(new Error(f.error?.message || "error"), { code: f.error?.code, details: f.error?.details }));
      return;
    }
    if (f.type === "event") {
      let gap = false;
      if (typeof f.seq === "number") { gap = this.lastSeq > 0 && f.seq > this.lastSeq + 1; this.lastSeq = f.seq; }
      this.onEvent(f.event, f.payload || {}, gap);
    }
  }

  /** A request; rejects with `transport: true` when it never reached an answer. */
  request(method, params = {}) {
    return new Promise((resolve, reject) => {
      if (!this.ws || !this.connected || this.ws.readyState !== 1) {
        return reject(Object.assign(new Error("not connected"), { transport: true }));
      }
      const id = String(this.nextId++);
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ type: "req", id, method, params }));
    });
  }
}
