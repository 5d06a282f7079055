//! HTML → readable text for `web_fetch` ([`super::web_fetch`]): the page is parsed as browsers
//! parse it (html5ever, through `scraper`) and its tree walked into markdown-ish text — headings as
//! `#` lines, links as `[text](url)` (made absolute), list items as `- ` / `1. `, `<pre>` as fenced
//! code, table rows as `a | b` lines — with scripts, styles, navigation, forms and hidden elements
//! dropped. Only `<main>` is read when the page has one. In text mode the same walk writes no
//! markdown marks (links are their text, headings plain lines). A hostile page nesting thousands of
//! elements (minutes of parsing: html5ever's scope checks are linear in the nesting) is read with
//! its tags stripped instead, and the walk keeps only the text below depth 200 (it recurses).

use scraper::{ElementRef, Html, Node};

/// A page made readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readable {
    /// The `<title>`, whitespace collapsed (none when missing or empty).
    pub title: Option<String>,
    /// The page's text.
    pub text: String,
}

/// Elements whose content is never text for a reader.
const SKIPPED: &[&str] = &[
    "head", "script", "style", "noscript", "template", "nav", "svg", "math", "canvas", "iframe", "object", "embed",
    "video", "audio", "form", "button", "select", "input", "textarea", "dialog",
];

/// Elements that start and end a line.
const BLOCKS: &[&str] = &[
    "div",
    "section",
    "article",
    "main",
    "header",
    "footer",
    "aside",
    "address",
    "figure",
    "figcaption",
    "details",
    "summary",
    "dl",
    "dt",
    "dd",
    "table",
    "thead",
    "tbody",
    "tfoot",
    "caption",
    "center",
    "fieldset",
    "body",
    "html",
];

/// Deepest element walked with its structure; below it only the text is kept (the walk recurses,
/// and a page nesting a million elements must not overflow the stack).
const MAX_DEPTH: usize = 200;

/// Elements set off by a blank line.
const PARAGRAPHS: &[&str] = &["p", "blockquote", "ul", "ol", "pre", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "table"];

/// Deepest nesting (estimated by [`nesting`]) parsed as HTML: html5ever's scope checks walk the
/// stack of open elements, so a page nesting 200,000 elements takes minutes to parse. Past it the
/// page's tags are stripped instead.
const MAX_NESTING: usize = 5_000;

/// Elements that never nest (void) or are closed by their next sibling (`<p>`, `<li>`, …).
const FLAT: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr", "p",
    "li", "dt", "dd", "td", "th", "tr", "option", "optgroup", "tbody", "thead", "tfoot", "colgroup", "caption", "rb",
    "rt", "rp", "!doctype",
];

/// `html` as text; `base` makes relative links absolute; `markdown` false writes plain text.
pub fn readable(html: &str, base: Option<&reqwest::Url>, markdown: bool) -> Readable {
    if nesting(html) > MAX_NESTING {
        return Readable { title: None, text: strip_tags(html) };
    }
    let doc = Html::parse_document(html);
    let root = doc.root_element();
    let title = descendants(root)
        .find(|e| e.value().name() == "title")
        .map(|t| collapse(&t.text().collect::<String>()))
        .filter(|t| !t.is_empty());
    let start = descendants(root).find(|e| e.value().name() == "main" && !hidden(*e)).unwrap_or(root);
    let mut w = Writer::new(markdown, base);
    w.element(start);
    Readable { title, text: w.finish() }
}

/// The most start tags open at once, counting neither [`FLAT`] elements nor self-closed ones.
fn nesting(html: &str) -> usize {
    let (mut open, mut most) = (0usize, 0usize);
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..end];
        if let Some(name) = tag.strip_prefix('/') {
            let name = name.split(|c: char| c.is_whitespace()).next().unwrap_or_default();
            if !FLAT.iter().any(|f| f.eq_ignore_ascii_case(name)) {
                open = open.saturating_sub(1);
            }
        } else if tag.starts_with(|c: char| c.is_ascii_alphabetic()) && !tag.ends_with('/') {
            let name = tag.split(|c: char| c.is_whitespace() || c == '/').next().unwrap_or_default();
            if !FLAT.iter().any(|f| f.eq_ignore_ascii_case(name)) {
                open += 1;
                most = most.max(open);
            }
        }
        rest = &rest[end..];
    }
    most
}

/// The text between the tags, whitespace collapsed (for a page too deep to parse).
fn strip_tags(html: &str) -> String {
    let mut text = String::with_capacity(html.len() / 2);
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        text.push_str(&rest[..i]);
        text.push(' ');
        rest = rest[i..].find('>').map_or("", |j| &rest[i + j + 1..]);
    }
    text.push_str(rest);
    collapse(&text)
}

/// `el`'s descendant elements, depth first.
fn descendants(el: ElementRef<'_>) -> impl Iterator<Item = ElementRef<'_>> {
    el.descendants().filter_map(ElementRef::wrap)
}

/// True for an element a browser would not show, or a navigation landmark.
fn hidden(el: ElementRef<'_>) -> bool {
    let v = el.value();
    v.attr("hidden").is_some()
        || v.attr("aria-hidden") == Some("true")
        || v.attr("role") == Some("navigation")
        || v.attr("style").is_some_and(|s| s.replace(' ', "").to_ascii_lowercase().contains("display:none"))
}

/// Whitespace runs as one space, trimmed.
fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The text being written: words joined by single spaces, lines started by the current prefix
/// (quote marks and list indentation) and an item's bullet.
struct Writer<'b> {
    out: String,
    markdown: bool,
    base: Option<&'b reqwest::Url>,
    /// Written at the start of each line.
    prefix: String,
    /// A list item's mark, written once at the start of the next line with text, after the first
    /// `.0` bytes of the prefix (the item's lines after the first are indented under it).
    bullet: Option<(usize, String)>,
    /// The current line has nothing yet (not even the prefix).
    line_start: bool,
    /// Newlines at the end of `out`.
    newlines: usize,
    /// A space is due before the next word.
    space: bool,
    /// Inside `<pre>`: text kept as it is.
    pre: usize,
    /// Open lists: `None` for `<ul>`, the next number for `<ol>`.
    lists: Vec<Option<u64>>,
    /// Elements open around the one being written.
    depth: usize,
}

impl<'b> Writer<'b> {
    fn new(markdown: bool, base: Option<&'b reqwest::Url>) -> Self {
        Writer {
            out: String::new(),
            markdown,
            base,
            prefix: String::new(),
            bullet: None,
            line_start: true,
            newlines: usize::MAX,
            space: false,
            pre: 0,
            lists: Vec::new(),
            depth: 0,
        }
    }

    /// Before writing text: the line's prefix and bullet, or the due space.
    fn begin(&mut self) {
        if self.line_start {
            match self.bullet.take() {
                Some((len, mark)) => {
                    self.out.push_str(self.prefix.get(..len).unwrap_or_default());
                    self.out.push_str(&mark);
                }
                None => self.out.push_str(&self.prefix),
            }
            self.line_start = false;
        } else if self.space {
            self.out.push(' ');
        }
        self.space = false;
        self.newlines = 0;
    }

    /// Text of the page: whitespace collapsed (kept inside `<pre>`).
    fn text(&mut self, s: &str) {
        if self.pre > 0 {
            for line in s.split_inclusive('\n') {
                let (body, nl) = line.strip_suffix('\n').map_or((line, false), |b| (b, true));
                if !body.is_empty() {
                    self.begin();
                    self.out.push_str(body);
                }
                if nl {
                    self.newline();
                }
            }
            return;
        }
        for (i, word) in s.split(|c: char| c.is_whitespace()).enumerate() {
            if i > 0 && !self.line_start {
                self.space = true;
            }
            if !word.is_empty() {
                self.begin();
                self.out.push_str(word);
            }
        }
    }

    /// Text written as it is (markdown marks), spaced like a word.
    fn raw(&mut self, s: &str) {
        self.begin();
        self.out.push_str(s);
    }

    fn newline(&mut self) {
        self.out.push('\n');
        self.newlines = self.newlines.saturating_add(1);
        self.line_start = true;
        self.space = false;
    }

    /// Ends the line, and leaves `n - 1` blank lines (none at the start of the text).
    fn brk(&mut self, n: usize) {
        while self.newlines < n {
            self.newline();
        }
        self.line_start = true;
        self.space = false;
    }

    fn children(&mut self, el: ElementRef<'_>) {
        for child in el.children() {
            match child.value() {
                Node::Text(t) => self.text(t),
                Node::Element(_) => {
                    if let Some(e) = ElementRef::wrap(child) {
                        self.element(e);
                    }
                }
                _ => {}
            }
        }
    }

    fn element(&mut self, el: ElementRef<'_>) {
        let name = el.value().name();
        if SKIPPED.contains(&name) || hidden(el) {
            return;
        }
        if self.depth >= MAX_DEPTH {
            // `text()` walks the subtree without recursing.
            for t in el.text() {
                self.text(t);
            }
            return;
        }
        self.depth += 1;
        self.element_inner(el, name);
        self.depth -= 1;
    }

    fn element_inner(&mut self, el: ElementRef<'_>, name: &str) {
        let para = PARAGRAPHS.contains(&name);
        if para {
            self.brk(2);
        } else if BLOCKS.contains(&name) {
            self.brk(1);
        }
        match name {
            "br" => self.newline(),
            "hr" => {
                if self.markdown {
                    self.raw("---");
                }
            }
            "h1" | "h2" | "h3" | "h4" | "h5" | "h6" => {
                if self.markdown {
                    let level = usize::from(name.as_bytes()[1] - b'0');
                    self.raw(&format!("{} ", "#".repeat(level)));
                }
                self.children(el);
            }
            "a" => self.link(el),
            "img" => {
                let alt = collapse(el.value().attr("alt").unwrap_or_default());
                if !alt.is_empty() {
                    match (self.markdown, el.value().attr("src").and_then(|s| self.url(s))) {
                        (true, Some(src)) => self.raw(&format!("![{alt}]({src})")),
                        _ => self.text(&alt),
                    }
                }
            }
            "ul" | "ol" => {
                let start = el.value().attr("start").and_then(|s| s.trim().parse().ok()).unwrap_or(1);
                self.lists.push((name == "ol").then_some(start));
                self.children(el);
                self.lists.pop();
            }
            "li" => self.item(el),
            "blockquote" => {
                let saved = self.prefix.len();
                self.prefix.push_str(if self.markdown { "> " } else { "  " });
                self.children(el);
                self.prefix.truncate(saved);
            }
            "pre" => {
                if self.markdown {
                    self.raw("```");
                    self.newline();
                }
                self.pre += 1;
                self.children(el);
                self.pre -= 1;
                if self.markdown {
                    self.brk(1);
                    self.raw("```");
                }
            }
            "code" if self.pre == 0 && self.markdown => {
                let mut inner = Writer::new(false, self.base);
                inner.children(el);
                let code = collapse(&inner.out);
                if !code.is_empty() {
                    self.raw(&format!("`{code}`"));
                }
            }
            "tr" => {
                self.brk(1);
                self.children(el);
                self.brk(1);
            }
            "td" | "th" => {
                if !self.line_start {
                    self.space = false;
                    self.raw(" |");
                    self.space = true;
                }
                self.children(el);
            }
            _ => self.children(el),
        }
        if para {
            self.brk(2);
        } else if BLOCKS.contains(&name) {
            self.brk(1);
        }
    }

    /// A list item: its mark, its lines indented under it.
    fn item(&mut self, el: ElementRef<'_>) {
        self.brk(1);
        let mark = match self.lists.last_mut() {
            Some(Some(n)) => {
                let m = format!("{n}. ");
                *n += 1;
                m
            }
            _ => "- ".to_owned(),
        };
        let saved = self.prefix.len();
        self.prefix.push_str(&" ".repeat(mark.len()));
        self.bullet = Some((saved, mark));
        self.children(el);
        // An empty item leaves no mark behind for the next line.
        self.bullet = None;
        self.prefix.truncate(saved);
        self.brk(1);
    }

    /// `[text](url)` in markdown, else the text; a link to this page or to script is its text.
    fn link(&mut self, el: ElementRef<'_>) {
        let href = el.value().attr("href").map(str::trim).filter(|h| !h.starts_with('#'));
        let url = href.and_then(|h| self.url(h));
        let Some(url) = url.filter(|_| self.markdown && self.pre == 0) else {
            return self.children(el);
        };
        let mut inner = Writer::new(true, self.base);
        inner.children(el);
        let text = collapse(&inner.out);
        if text.is_empty() {
            return;
        }
        self.raw(&format!("[{text}]({url})"));
    }

    /// `href` made absolute against the page; `None` for what a reader cannot follow (`javascript:`).
    fn url(&self, href: &str) -> Option<String> {
        let url = match self.base {
            Some(base) => base.join(href).ok()?,
            None => reqwest::Url::parse(href).ok()?,
        };
        matches!(url.scheme(), "http" | "https" | "mailto" | "ftp").then(|| url.to_string())
    }

    /// The text: lines without trailing spaces, at most one blank line in a row, trimmed.
    fn finish(self) -> String {
        let mut out = String::with_capacity(self.out.len());
        let mut blank = 0;
        for line in self.out.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                blank += 1;
                continue;
            }
            if !out.is_empty() {
                out.push_str(if blank > 0 { "\n\n" } else { "\n" });
            }
            blank = 0;
            out.push_str(line);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deep_nesting_keeps_the_text_without_overflowing_the_stack() {
        let depth = 2_400;
        let page = format!("{}<p>deep <b>text</b></p>{}", "<div><span>".repeat(depth), "</span></div>".repeat(depth));
        let r = readable(&page, None, true);
        assert_eq!(r.text, "deep text");
    }

    #[test]
    fn a_page_too_deep_to_parse_is_read_with_its_tags_stripped() {
        let depth = 200_000;
        let page =
            format!("<title>t</title>{}<p>deep <b>text</b></p>{}", "<div>".repeat(depth), "</div>".repeat(depth));
        let started = std::time::Instant::now();
        let r = readable(&page, None, true);
        eprintln!("{} nested divs read in {:?}", depth, started.elapsed());
        assert_eq!(r, Readable { title: None, text: "t deep text".to_owned() });
        // Unclosed paragraphs and list items do not nest.
        let flat = format!("<ul>{}</ul>", "<li><p>item<br>".repeat(MAX_NESTING + 1));
        assert!(nesting(&flat) < 5, "{}", nesting(&flat));
        // Parsed as HTML, not stripped.
        let text = readable(&flat, None, true).text;
        assert!(text.starts_with("- item\n\n- item\n\n- item"), "{}", &text[..40]);
    }
}
