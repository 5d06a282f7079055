//! Secret redaction applied to every message before it is written (and usable for logs).
//!
//! The default patterns catch API keys and tokens of the common providers, bearer tokens and PEM
//! private keys; more can be configured, and redaction can be turned off. Secrets known by value
//! (configured API keys, keys and tokens from the environment, the gateway token) are redacted
//! wherever they appear, whatever they look like, with one Aho-Corasick pass. Image data is never
//! touched (base64 can look like anything).

use aho_corasick::{AhoCorasick, MatchKind};
use regex::{Regex, RegexSet};
use serde_json::Value;
use std::borrow::Cow;
use std::sync::Arc;

/// Rewrites secrets inside a message before it reaches disk.
pub trait Redactor: Send + Sync {
    /// Redacts the strings of one message (or any entry payload) in place.
    fn redact_value(&self, v: &mut Value);
    /// Redacts one string (for logs).
    fn redact_str(&self, s: &str) -> String;
}

/// No redaction at all (`redaction = "off"`).
pub struct NoRedaction;

impl Redactor for NoRedaction {
    fn redact_value(&self, _: &mut Value) {}
    fn redact_str(&self, s: &str) -> String {
        s.to_owned()
    }
}

/// Pattern-based redaction: each match keeps a short prefix so a reader can tell which key it was.
pub struct SecretRedactor {
    patterns: Vec<Regex>,
    /// The patterns as one set: one scan tells whether any matches (most strings: none).
    any: Arc<RegexSet>,
    /// Exact secret values (at least [`MIN_KNOWN_SECRET_LEN`] bytes each).
    known: Option<AhoCorasick>,
}

/// Known secret values shorter than this are not redacted by value (too many false hits).
pub const MIN_KNOWN_SECRET_LEN: usize = 8;

/// The built-in patterns.
pub const DEFAULT_PATTERNS: &[&str] = &[
    // PEM private keys (whole block).
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
    // OpenAI / Anthropic / OpenRouter style keys.
    r"\bsk-(?:ant-|proj-|or-)?[A-Za-z0-9_\-]{20,}",
    // GitHub tokens.
    r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}",
    r"\bgithub_pat_[A-Za-z0-9_]{40,}",
    // Slack tokens.
    r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
    // AWS access key ids.
    r"\bAKIA[0-9A-Z]{16}\b",
    // Google API keys.
    r"\bAIza[0-9A-Za-z_\-]{35}",
    // Groq, xAI, Hugging Face, Stripe-like keys.
    r"\b(?:gsk|xai|hf|sk_live|rk_live)_[A-Za-z0-9]{20,}",
    // Bearer tokens in pasted headers.
    r"(?i)\bbearer\s+[A-Za-z0-9._~+/\-]{16,}=*",
];

/// [`DEFAULT_PATTERNS`] compiled once per process (compiling them costs ~0.4 ms, which every
/// `Store::new` paid); a `Regex` clone shares the compiled program.
fn default_regexes() -> &'static [Regex] {
    static COMPILED: std::sync::LazyLock<Vec<Regex>> =
        std::sync::LazyLock::new(|| DEFAULT_PATTERNS.iter().filter_map(|p| Regex::new(p).ok()).collect());
    &COMPILED
}

/// `patterns` as one set.
fn set_of(patterns: &[Regex]) -> Result<Arc<RegexSet>, String> {
    RegexSet::new(patterns.iter().map(Regex::as_str)).map(Arc::new).map_err(|e| e.to_string())
}

/// The set of [`DEFAULT_PATTERNS`], compiled once per process.
fn default_set() -> Result<Arc<RegexSet>, String> {
    static COMPILED: std::sync::OnceLock<Result<Arc<RegexSet>, String>> = std::sync::OnceLock::new();
    COMPILED.get_or_init(|| set_of(default_regexes())).clone()
}

impl SecretRedactor {
    /// The default patterns plus `extra` ones; an invalid extra pattern is an error naming it.
    pub fn new(extra: &[String]) -> Result<SecretRedactor, String> {
        let mut patterns = default_regexes().to_vec();
        for p in extra {
            patterns.push(Regex::new(p).map_err(|e| format!("invalid redaction pattern {p:?}: {e}"))?);
        }
        let any = if extra.is_empty() { default_set() } else { set_of(&patterns) }
            .map_err(|e| format!("cannot combine the redaction patterns: {e}"))?;
        Ok(SecretRedactor { patterns, any, known: None })
    }

    /// Also redacts each of `values` wherever it appears (values shorter than
    /// [`MIN_KNOWN_SECRET_LEN`] bytes, or blank, are ignored).
    pub fn with_known_values<I, S>(mut self, values: I) -> Result<SecretRedactor, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut v: Vec<String> = values
            .into_iter()
            .map(|s| s.as_ref().trim().to_owned())
            .filter(|s| s.len() >= MIN_KNOWN_SECRET_LEN)
            .collect();
        v.sort();
        v.dedup();
        self.known = if v.is_empty() {
            None
        } else {
            let ac = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&v)
                .map_err(|e| format!("cannot build the known-secret matcher: {e}"))?;
            Some(ac)
        };
        Ok(self)
    }
}

impl Default for SecretRedactor {
    fn default() -> Self {
        SecretRedactor::new(&[]).unwrap_or_else(|_| SecretRedactor {
            patterns: Vec::new(),
            any: Arc::new(RegexSet::empty()),
            known: None,
        })
    }
}

fn mask(m: &str) -> String {
    if m.starts_with("-----BEGIN") {
        return "[REDACTED PRIVATE KEY]".into();
    }
    let keep: String = m.chars().take(6).collect();
    format!("{keep}…[REDACTED]")
}

/// The marker for a secret known by value: like [`mask`], but the kept prefix is at most an eighth
/// of the value (a known value need not start with a public prefix such as `sk-`).
fn mask_known(m: &str) -> String {
    let keep: String = m.chars().take((m.chars().count() / 8).min(6)).collect();
    format!("{keep}…[REDACTED]")
}

impl SecretRedactor {
    /// `s` with every secret masked; borrowed when there is none (the usual case).
    fn redacted<'a>(&self, s: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(s);
        if let Some(ac) = &self.known {
            if ac.is_match(s) {
                let mut r = String::with_capacity(s.len());
                ac.replace_all_with(s, &mut r, |_, m, dst| {
                    dst.push_str(&mask_known(m));
                    true
                });
                out = Cow::Owned(r);
            }
        }
        if !self.any.is_match(&out) {
            return out;
        }
        // Each pattern runs on what the ones before it left.
        for re in &self.patterns {
            if re.is_match(&out) {
                out = Cow::Owned(re.replace_all(&out, |c: &regex::Captures| mask(&c[0])).into_owned());
            }
        }
        out
    }
}

impl Redactor for SecretRedactor {
    fn redact_str(&self, s: &str) -> String {
        self.redacted(s).into_owned()
    }

    fn redact_value(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if let Cow::Owned(r) = self.redacted(s) {
                    *s = r;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.redact_value(x)),
            Value::Object(o) => {
                let is_image = o.get("type").and_then(Value::as_str) == Some("image");
                for (k, x) in o.iter_mut() {
                    if is_image && k == "data" {
                        continue;
                    }
                    self.redact_value(x);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_default_pattern_compiles_and_is_used() {
        assert_eq!(default_regexes().len(), DEFAULT_PATTERNS.len());
        let r = SecretRedactor::new(&["secret-[0-9]+".into()]).expect("valid");
        assert_eq!(r.patterns.len(), DEFAULT_PATTERNS.len() + 1);
        assert!(SecretRedactor::new(&["(".into()]).is_err());
    }

    #[test]
    fn redacts_keys_but_not_images() {
        let r = SecretRedactor::default();
        let mut m = json!({"role":"user","content":[
            {"type":"text","text":"my key is sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345 ok"},
            {"type":"image","data":"sk-abcdefghijklmnopqrstuvwxyz","mimeType":"image/png"}]});
        r.redact_value(&mut m);
        assert_eq!(m["content"][0]["text"], "my key is sk-ant…[REDACTED] ok");
        assert_eq!(m["content"][1]["data"], "sk-abcdefghijklmnopqrstuvwxyz");
        assert_eq!(
            r.redact_str("Authorization: Bearer abcdefghijklmnopqrstuvwxyz"),
            "Authorization: Bearer…[REDACTED]"
        );
        assert_eq!(r.redact_str("nothing here"), "nothing here");
        assert!(SecretRedactor::new(&["(".into()]).is_err());
        let custom = SecretRedactor::new(&["internal-[0-9]{4}".into()]).expect("valid");
        assert_eq!(custom.redact_str("id internal-1234"), "id intern…[REDACTED]");
    }

    #[test]
    fn known_values_are_redacted_wherever_they_appear() {
        let token = "0f3c9a7e5b2d4c6e8a1b3d5f7a9c2e4b";
        let r = SecretRedactor::new(&[])
            .expect("valid")
            .with_known_values([token, "local-key-12345", "short", "", "  local-key-12345  "])
            .expect("built");
        assert_eq!(
            r.redact_str(&format!("token={token}, key=local-key-12345;")),
            "token=0f3c…[REDACTED], key=l…[REDACTED];"
        );
        assert_eq!(r.redact_str("short stays"), "short stays", "values under 8 bytes are not used");
        // The longest known value wins where values overlap; patterns still apply afterwards.
        let r2 = SecretRedactor::default().with_known_values(["abcdefgh", "abcdefghijklmnop"]).expect("built");
        assert_eq!(r2.redact_str("abcdefghijklmnop sk-zyxwvutsrqponmlkjihgfedcba"), "ab…[REDACTED] sk-zyx…[REDACTED]");
        let mut v = json!({"content": [{"type": "text", "text": format!("x {token} y")}]});
        r.redact_value(&mut v);
        assert_eq!(v["content"][0]["text"], "x 0f3c…[REDACTED] y");
    }
}
