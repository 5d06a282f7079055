// The composer: a draft per session that survives a reload, Enter to send (never while an IME is
// composing), Shift+Enter for a new line, images by paste, drag and drop or the file picker, with
// previews and the gateway's size limits checked before anything is sent.
import { el, store } from "/webchat/js/util.js";

/** The gateway's limits: `pincer.info` says them (see setLimits); these are only the values before it answered. */
let MAX_IMAGE_BYTES = 5 * 1024 * 1024;
let MAX_IMAGES_BYTES = 20 * 1024 * 1024;
export function setLimits(limits) {
  if (limits?.attachmentBytes > 0) MAX_IMAGE_BYTES = limits.attachmentBytes;
  if (limits?.attachmentsBytes > 0) MAX_IMAGES_BYTES = limits.attachmentsBytes;
}

export class Composer {
  constructor({ form, input, attachments, fileInput, onSubmit, onError }) {
    Object.assign(this, { form, input, box: attachments, onSubmit, onError });
    this.sessionKey = null; this.files = []; this.composing = false;
    input.addEventListener("compositionstart", () => { this.composing = true; });
    input.addEventListener("compositionend", () => { this.composing = false; });
    input.addEventListener("keydown", (e) => {
      if (e.key !== "Enter" || e.shiftKey) return;
      // IME: Enter confirms the composition, it does not send.
      if (e.isComposing || this.composing || e.keyCode === 229) return;
      e.preventDefault();
      form.requestSubmit();
    });
    input.addEventListener("input", () => { this.saveDraft(); this.autosize(); });
    input.addEventListener("paste", (e) => {
      const files = [...(e.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
      if (files.length) { e.preventDefault(); this.addFiles(files); }
    });
    form.addEventListener("dragover", (e) => { if ([...e.dataTransfer.items].some((i) => i.kind === "file")) { e.preventDefault(); form.classList.add("dragging"); } });
    form.addEventListener("dragleave", () => form.classList.remove("dragging"));
    form.addEventListener("drop", (e) => {
      form.classList.remove("dragging");
      const files = [...(e.dataTransfer?.files || [])];
      if (files.length) { e.preventDefault(); this.addFiles(files); }
    });
    fileInput.addEventListener("change", () => { this.addFiles([...fileInput.files]); fileInput.value = ""; });
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const text = input.value;
      if (!text.trim() && !this.files.length) return;
      const err = this.checkSizes();
      if (err) { this.onError(err); return; }
      const attachments = this.files.map((f) => ({ type: "image", mimeType: f.mimeType, fileName: f.name, content: f.data }));
      this.onSubmit(text, attachments);
      input.value = ""; this.files = []; this.renderFiles(); this.saveDraft(); this.autosize();
    });
  }

  draftKey() { return `pincer.draft.${this.sessionKey}`; }

  saveDraft() {
    if (!this.sessionKey) return;
    if (this.input.value) store.set(this.draftKey(), this.input.value); else store.remove(this.draftKey());
  }

  /** Switches to another session's draft (the current one is kept). */
  setSession(key) {
    this.saveDraft();
    this.sessionKey = key;
    this.input.value = store.get(this.draftKey(), "") || "";
    this.files = []; this.renderFiles(); this.autosize();
  }

  setText(text) { this.input.value = text; this.saveDraft(); this.autosize(); this.input.focus(); }

  autosize() { this.input.style.height = "auto"; this.input.style.height = Math.min(this.input.scrollHeight + 2, 192) + "px"; }

  checkSizes() {
    const big = this.files.find((f) => f.size > MAX_IMAGE_BYTES);
    if (big) return `${big.name} is ${(big.size / 1048576).toFixed(1)} MB; images may be at most ${MAX_IMAGE_BYTES / 1048576} MB each. Remove it to send.`;
    const total = this.files.reduce((s, f) => s + f.size, 0);
    if (total > MAX_IMAGES_BYTES) return `The images are ${(total / 1048576).toFixed(1)} MB together; at most ${MAX_IMAGES_BYTES / 1048576} MB may go in one message.`;
    return null;
  }

  async addFiles(files) {
    for (const f of files) {
      if (!f.type.startsWith("image/")) { this.onError(`${f.name || "That file"} is not an image: only images can be attached.`); continue; }
      const data = await new Promise((res, rej) => {
        const r = new FileReader();
        r.onload = () => res(String(r.result).split(",")[1] || "");
        r.onerror = () => rej(r.error);
        r.readAsDataURL(f);
      }).catch(() => null);
      if (data === null) { this.onError(`Could not read ${f.name}.`); continue; }
      this.files.push({ name: f.name || "pasted image", mimeType: f.type, size: f.size, data, url: URL.createObjectURL(f) });
    }
    this.renderFiles();
    const err = this.checkSizes();
    if (err) this.onError(err);
  }

  renderFiles() {
    this.box.replaceChildren(...this.files.map((f, i) => el("div", { class: "chip", "data-testid": "attachment-preview", title: `${f.name} (${Math.round(f.size / 1024)} KB)` },
      el("img", { src: f.url, alt: f.name }),
      el("button", { type: "button", "aria-label": `Remove ${f.name}`, onclick: () => { URL.revokeObjectURL(f.url); this.files.splice(i, 1); this.renderFiles(); } }, "✕"))));
  }

  focus() { this.input.focus(); }
}
