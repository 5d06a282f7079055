// Small helpers shared by the WebChat modules: DOM building, message text, times, ids, storage.

/** Creates an element: el("button", {class: "x", onclick}, "text", child…). */
export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

export const $ = (id) => document.getElementById(id);

/** The text of a message: string content or its text blocks. */
export function textOf(msg) {
  if (!msg) return "";
  if (typeof msg.content === "string") return msg.content;
  if (!Array.isArray(msg.content)) return typeof msg.text === "string" ? msg.text : "";
  return msg.content.filter((b) => b && b.type === "text").map((b) => b.text || "").join("\n");
}

/** The marker chat.history leaves where it cut a long text. */
export const TRUNCATED = "\n...(truncated)...";

export function uuid() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  return [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}

/** Milliseconds since the epoch from a number or an ISO string, or null. */
export function toMs(t) {
  if (typeof t === "number" && Number.isFinite(t)) return t;
  if (typeof t === "string") { const v = Date.parse(t); return Number.isFinite(v) ? v : null; }
  return null;
}

const rtf = typeof Intl !== "undefined" && Intl.RelativeTimeFormat ? new Intl.RelativeTimeFormat(undefined, { numeric: "auto" }) : null;

/** "just now", "5 min ago", "yesterday", or a date. */
export function relTime(ms, now = Date.now()) {
  if (!ms) return "";
  const s = Math.round((ms - now) / 1000);
  const a = Math.abs(s);
  if (a < 45) return "just now";
  if (!rtf) return new Date(ms).toLocaleString();
  if (a < 3600) return rtf.format(Math.round(s / 60), "minute");
  if (a < 86400) return rtf.format(Math.round(s / 3600), "hour");
  if (a < 7 * 86400) return rtf.format(Math.round(s / 86400), "day");
  return new Date(ms).toLocaleDateString();
}

export function fullTime(ms) { return ms ? new Date(ms).toLocaleString() : ""; }
export function shortTime(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }) : d.toLocaleDateString([], { month: "short", day: "numeric" });
}

/** localStorage that never throws (private mode, quota): returns false when a write failed. */
export const store = {
  get(k, fallback = null) { try { const v = localStorage.getItem(k); return v === null ? fallback : v; } catch { return fallback; } },
  getJSON(k, fallback) { try { const v = localStorage.getItem(k); return v === null ? fallback : JSON.parse(v); } catch { return fallback; } },
  set(k, v) { try { localStorage.setItem(k, v); return true; } catch { return false; } },
  setJSON(k, v) { try { localStorage.setItem(k, JSON.stringify(v)); return true; } catch { return false; } },
  remove(k) { try { localStorage.removeItem(k); } catch { /* nothing to do */ } },
};

const ICONS = {
  archive: "M3 4h18v4H3zM5 8v11h14V8M10 12h4",
  trash: "M4 7h16M9 7V4h6v3M6 7l1 13h10l1-13M10 11v6M14 11v6",
  clip: "M21 11.5l-8.5 8.5a5 5 0 0 1-7-7L14 4.5a3.5 3.5 0 0 1 5 5L10.5 18a2 2 0 0 1-3-3L15 7.5",
  pencil: "M4 20h4L19 9l-4-4L4 16zM13.5 6.5l4 4",
  restore: "M4 12a8 8 0 1 0 3-6.2M4 4v5h5",
  download: "M12 4v11M7 10l5 5 5-5M5 20h14",
};

/** A small stroke icon (inline SVG, so no font or image is needed). */
export function icon(name) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 24 24"); svg.setAttribute("width", "16"); svg.setAttribute("height", "16");
  svg.setAttribute("aria-hidden", "true"); svg.setAttribute("class", "ico");
  const p = document.createElementNS(ns, "path");
  p.setAttribute("d", ICONS[name] || ""); p.setAttribute("fill", "none"); p.setAttribute("stroke", "currentColor");
  p.setAttribute("stroke-width", "1.8"); p.setAttribute("stroke-linecap", "round"); p.setAttribute("stroke-linejoin", "round");
  svg.append(p);
  return svg;
}
