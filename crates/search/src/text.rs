//! The rules of search that do not depend on an engine, in one place for both indexes (SQLite
//! FTS5 here, PostgreSQL full-text search in `pincer-pg`):
//! - which text a transcript line is found by ([`line_message`]: the text blocks of user and
//!   assistant messages);
//! - what a user's query means ([`parse_query`]: words that must all match, `"quoted phrases"`,
//!   `prefix*` on a word or a phrase; nothing else is syntax);
//! - words as both indexes see them ([`tokens`]: runs of letters and digits, lowercased, diacritics
//!   removed, as FTS5's `unicode61 remove_diacritics 2` tokenizer reads them);
//! - a hit's snippet where the engine has none of its own ([`snippet`]).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

/// One term of a query: a word or a phrase, all of whose words must match in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    /// The text as typed (inside the quotes for a phrase).
    pub text: String,
    /// `word*` or `"a phrase"*`: the last word matches as a prefix.
    pub prefix: bool,
}

/// A user's query as its terms (all must match). Terms without a letter or digit are dropped;
/// an empty answer means there is nothing to search for.
pub fn parse_query(input: &str) -> Vec<Term> {
    let mut terms: Vec<Term> = Vec::new();
    let mut chars = input.chars().peekable();
    let push = |terms: &mut Vec<Term>, text: &str, prefix: bool| {
        if text.chars().any(char::is_alphanumeric) {
            terms.push(Term { text: text.to_owned(), prefix });
        }
    };
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        if c == '"' {
            chars.next();
            let phrase: String = chars.by_ref().take_while(|&c| c != '"').collect();
            let prefix = chars.peek() == Some(&'*');
            if prefix {
                chars.next();
            }
            push(&mut terms, phrase.trim(), prefix);
            continue;
        }
        let mut word = String::new();
        while let Some(&c) = chars.peek() {
            if c.is_whitespace() || c == '"' {
                break;
            }
            word.push(c);
            chars.next();
        }
        let prefix = word.ends_with('*');
        push(&mut terms, word.trim_end_matches('*'), prefix);
    }
    terms
}

/// Most words a query searches for at once (each word of a phrase counts): every word is one more
/// list of messages for the engine to read and intersect (150 `m*` took SQLite 50 s).
pub const MAX_QUERY_WORDS: usize = 32;

/// Refuses a query of more than [`MAX_QUERY_WORDS`] words, naming the limit (for both indexes).
pub fn check_query_size(terms: &[Term]) -> Result<(), String> {
    let words: usize = terms.iter().map(|t| tokens(&t.text).len()).sum();
    if words > MAX_QUERY_WORDS {
        return Err(format!(
            "query has {words} words; at most {MAX_QUERY_WORDS} are searched for at once (each word of a phrase counts)"
        ));
    }
    Ok(())
}

/// The word a `prefix*` term's last word is, folded as the index has it (`None` for whole words).
pub fn prefix_word(term: &Term) -> Option<String> {
    term.prefix.then(|| tokens(&term.text).pop()).flatten()
}

/// The words of `text` with their byte ranges in it: runs of letters and digits (combining marks
/// belong to the word they follow).
fn word_spans(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    for (i, c) in text.char_indices() {
        let inside = c.is_alphanumeric() || (start.is_some() && is_combining_mark(c));
        match (inside, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// One word folded: lowercase, diacritics removed (`Éclair` → `eclair`).
pub fn fold(word: &str) -> String {
    word.nfd().filter(|c| !is_combining_mark(*c)).flat_map(char::to_lowercase).collect()
}

/// The words of `text`, folded, in order.
pub fn tokens(text: &str) -> Vec<String> {
    word_spans(text).into_iter().map(|(a, b)| fold(&text[a..b])).filter(|w| !w.is_empty()).collect()
}

#[derive(Deserialize)]
struct LineHead<'a> {
    #[serde(rename = "type")]
    ty: Option<std::borrow::Cow<'a, str>>,
    id: Option<String>,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Message {
    role: Option<String>,
    content: Option<Value>,
    timestamp: Option<Value>,
}

/// What a message is found by.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub entry_id: String,
    /// `user` or `assistant`.
    pub role: String,
    /// Its text blocks, one per line.
    pub text: String,
    /// The message's time (ms since the epoch; 0 when unknown).
    pub timestamp: i64,
}

/// The searchable message of a transcript line: a `message` entry of a user or assistant with
/// some text (`None` for every other line).
pub fn line_message(line: &[u8]) -> Option<Found> {
    let head = serde_json::from_slice::<LineHead<'_>>(line).ok()?;
    if head.ty.as_deref() != Some("message") {
        return None;
    }
    let (entry_id, raw) = (head.id?, head.message?);
    let m: Message = serde_json::from_str(raw.get()).ok()?;
    let role = m.role?;
    if role != "user" && role != "assistant" {
        return None;
    }
    let text = pincer_pi::text_blocks(m.content.as_ref()).join("\n");
    if text.trim().is_empty() {
        return None;
    }
    let timestamp = pincer_store::ids::js_date_ms(m.timestamp.as_ref()).unwrap_or(0);
    Some(Found { entry_id, role, text, timestamp })
}

/// A transcript's title as search shows it: its first user message, one line.
pub fn title_of(text: &str) -> String {
    pincer_pi::one_line(text, pincer_pi::HEADLINE_CHARS)
}

/// Words a snippet holds at most (as FTS5's `snippet(…, 24)`).
pub const SNIPPET_WORDS: usize = 24;

/// The part of `text` around the first match of the query's terms: at most [`SNIPPET_WORDS`]
/// words, `…` where text was left out (the whole text when it is short).
pub fn snippet(text: &str, terms: &[Term]) -> String {
    let spans = word_spans(text);
    if spans.len() <= SNIPPET_WORDS {
        return text.trim().to_owned();
    }
    let words: Vec<String> = spans.iter().map(|&(a, b)| fold(&text[a..b])).collect();
    let matches_at = |i: usize, t: &Term| {
        let want = tokens(&t.text);
        !want.is_empty()
            && want.iter().enumerate().all(|(k, w)| {
                let last = k + 1 == want.len();
                words.get(i + k).is_some_and(|have| if last && t.prefix { have.starts_with(w) } else { have == w })
            })
    };
    let first = (0..words.len()).find(|&i| terms.iter().any(|t| matches_at(i, t))).unwrap_or(0);
    let start = first.saturating_sub(4).min(spans.len() - SNIPPET_WORDS);
    let end = start + SNIPPET_WORDS;
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    out.push_str(&text[spans[start].0..spans[end - 1].1]);
    if end < spans.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_terms_and_nothing_else() {
        let t = |text: &str, prefix| Term { text: text.into(), prefix };
        assert_eq!(parse_query("lisbon museum"), vec![t("lisbon", false), t("museum", false)]);
        assert_eq!(parse_query("\"pena palace\" sin*"), vec![t("pena palace", false), t("sin", true)]);
        assert_eq!(parse_query("foo\" OR 1=1 --"), vec![t("foo", false), t("OR 1=1 --", false)]);
        assert_eq!(parse_query("  * \"\" -- "), vec![]);
    }

    #[test]
    fn words_are_folded() {
        assert_eq!(tokens("Café CRÈME, naïve-ish 1=1 a&!b:*"), ["cafe", "creme", "naive", "ish", "1", "1", "a", "b"]);
        assert_eq!(tokens("e\u{301}clair"), ["eclair"]);
    }

    #[test]
    fn snippets_hold_the_match() {
        let text = (0..60).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
        let s = snippet(&text, &parse_query("w30"));
        assert!(s.starts_with("…w26 ") && s.ends_with(" w49…"), "{s}");
        assert_eq!(snippet("short text", &parse_query("x")), "short text");
    }
}
