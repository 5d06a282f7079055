// Markdown for messages: marked (GFM: tables, fenced code) → DOMPurify (no scripts, handlers,
// styles, forms or frames survive) → highlight.js on code blocks, each in a box that scrolls sideways
// under a Copy button that stays in view; links open in a new tab with rel="noopener noreferrer".
// Remote images are blocked by the page's CSP.
import { Marked } from "/webchat/vendor/marked.esm.js";
import DOMPurify from "/webchat/vendor/purify.es.mjs";
import hljs from "/webchat/vendor/highlight.min.js";
import { el } from "/webchat/js/util.js";

const marked = new Marked({ gfm: true, breaks: true, async: false });
hljs.configure({ ignoreUnescapedHTML: true });

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href") || "";
    if (!/^(https?:|mailto:|#)/i.test(href)) node.removeAttribute("href");
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY = {
  FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "iframe", "object", "embed", "svg", "math", "link", "meta", "base"],
  FORBID_ATTR: ["style", "srcset", "action", "formaction"],
  ALLOW_DATA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};

/** Renders Markdown text into `target` (replacing its content). */
export function renderMarkdown(target, text) {
  const html = marked.parse(text || "");
  const frag = DOMPurify.sanitize(html, PURIFY);
  for (const table of frag.querySelectorAll("table")) {
    const wrap = el("div", { class: "table-wrap" });
    table.replaceWith(wrap);
    wrap.append(table);
  }
  for (const code of frag.querySelectorAll("pre > code")) {
    try {
      const lang = [...code.classList].find((c) => c.startsWith("language-"))?.slice(9);
      if (lang && !hljs.getLanguage(lang)) code.className = "";
      hljs.highlightElement(code);
    } catch { /* left plain */ }
    const pre = code.parentElement;
    const box = el("div", { class: "code-block" });
    pre.replaceWith(box);
    box.append(el("button", { type: "button", class: "copy", "aria-label": "Copy the code", "data-testid": "copy-code",
      onclick: (e) => copyText(code.textContent, e.currentTarget, "Copy") }, "Copy"), pre);
  }
  target.replaceChildren(frag);
}

/** Puts `text` on the clipboard; `button` says "Copied" for a moment, then `label` again. */
export async function copyText(text, button, label) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const ta = el("textarea", { class: "sr-only" });
    ta.value = text; document.body.append(ta); ta.select();
    try { document.execCommand("copy"); } catch { /* nothing more to try */ }
    ta.remove();
  }
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = label; }, 1500);
}
