//! The safeguard quality guard: a summary must have the sections the prompt asks for, mention the
//! last user request of the summarized turns, and keep the identifiers (file paths, URLs, ids) that
//! appear in the user and assistant text of those turns. A failing summary is regenerated with the
//! reasons appended to the prompt; after the retries the compaction is cancelled.

use regex::Regex;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::OnceLock;

/// Headings both history prompts require.
pub const HISTORY_SECTIONS: [&str; 6] = [
    "## Goal",
    "## Constraints & Preferences",
    "## Progress",
    "## Key Decisions",
    "## Next Steps",
    "## Critical Context",
];
/// Headings the turn-prefix prompt requires.
pub const TURN_PREFIX_SECTIONS: [&str; 3] = ["## Original Request", "## Early Progress", "## Context for Suffix"];
/// At most this many identifiers (the most recent ones) are required.
pub const MAX_IDENTIFIERS: usize = 16;

/// Why a summary was rejected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QualityIssues {
    pub missing_sections: Vec<String>,
    pub missing_identifiers: Vec<String>,
    /// The last user request, when the summary does not reflect it.
    pub missing_request: Option<String>,
    pub empty: bool,
}

impl QualityIssues {
    pub fn is_ok(&self) -> bool {
        self.missing_sections.is_empty()
            && self.missing_identifiers.is_empty()
            && self.missing_request.is_none()
            && !self.empty
    }

    /// One line per problem (for errors and for the regeneration prompt).
    pub fn describe(&self) -> String {
        let mut out = Vec::new();
        if self.empty {
            out.push("the summary is empty".to_owned());
        }
        if !self.missing_sections.is_empty() {
            out.push(format!("missing sections: {}", self.missing_sections.join(", ")));
        }
        if let Some(r) = &self.missing_request {
            out.push(format!("the last user request is not reflected: {:?}", clip(r, 200)));
        }
        if !self.missing_identifiers.is_empty() {
            out.push(format!("identifiers dropped: {}", self.missing_identifiers.join(", ")));
        }
        out.join("; ")
    }

    /// Text appended to the prompt of a regeneration.
    pub fn retry_instructions(&self) -> String {
        format!(
            "\n\nA previous summary was rejected ({}). Produce the summary again in the EXACT format above, \
             restate the user's latest request, and copy every file path and identifier listed exactly.",
            self.describe()
        )
    }
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn identifier_re() -> Option<&'static Regex> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| {
        let url = r"https?://[^\s<>()\[\]{}'`]+[^\s<>()\[\]{}'`.,;:!?]";
        let path = r"(?:~|\.{1,2})?/?(?:[A-Za-z0-9_.@\-]+/)+[A-Za-z0-9_@\-]+\.[A-Za-z0-9]{1,8}\b";
        let file = r"\b[A-Za-z0-9_\-]+\.(?:rs|ts|tsx|js|jsx|mjs|cjs|py|go|java|kt|swift|c|h|cc|cpp|hpp|rb|php|cs|md|json|jsonl|toml|yaml|yml|txt|sh|sql|css|html|lock)\b";
        let uuid = r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b";
        // A constant pattern; the tests prove it compiles.
        Regex::new(&format!("{url}|{path}|{uuid}|{file}")).ok()
    })
    .as_ref()
}

/// The identifiers in a text, in order of appearance.
pub fn identifiers_in(text: &str) -> Vec<String> {
    match identifier_re() {
        Some(re) => re.find_iter(text).map(|m| m.as_str().to_owned()).collect(),
        None => Vec::new(),
    }
}

/// What the guard expects of a summary of `messages`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expectations {
    pub sections: Vec<&'static str>,
    pub identifiers: Vec<String>,
    pub last_request: Option<String>,
}

impl Expectations {
    /// From the summarized messages (history and turn prefix, in order).
    pub fn from_messages(messages: &[&Value], history: bool, turn_prefix: bool) -> Expectations {
        let mut sections = Vec::new();
        if history {
            sections.extend(HISTORY_SECTIONS);
        }
        if turn_prefix {
            sections.extend(TURN_PREFIX_SECTIONS);
        }
        let mut ids: Vec<String> = Vec::new();
        let mut last_request = None;
        for m in messages {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("");
            let text = match role {
                "user" => {
                    let t = pincer_pi::text_blocks(m.get("content")).join("\n");
                    if !t.trim().is_empty() {
                        last_request = Some(t.clone());
                    }
                    t
                }
                "assistant" => pincer_pi::text_blocks(m.get("content")).join("\n"),
                _ => continue,
            };
            ids.extend(identifiers_in(&text));
        }
        // Keep the most recent occurrence of each, then the last MAX_IDENTIFIERS.
        let mut seen = HashSet::new();
        let mut recent: Vec<String> = ids.into_iter().rev().filter(|i| seen.insert(i.clone())).collect();
        recent.truncate(MAX_IDENTIFIERS);
        recent.reverse();
        Expectations { sections, identifiers: recent, last_request }
    }
}

const STOPWORDS: [&str; 40] = [
    "this", "that", "with", "from", "have", "what", "when", "where", "which", "please", "could", "would", "should",
    "there", "their", "them", "then", "than", "into", "your", "about", "also", "just", "like", "make", "some", "will",
    "does", "done", "were", "been", "being", "they", "these", "those", "only", "need", "want", "here", "after",
];

/// Distinct lowercase words of 4+ letters that carry meaning.
fn keywords(text: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    text.split(|c: char| !c.is_alphanumeric() && c != '_')
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 4 && !STOPWORDS.contains(&w.as_str()))
        .filter(|w| seen.insert(w.clone()))
        .take(24)
        .collect()
}

/// Checks `summary` (the text as it will be stored, file lists included) against `exp`.
pub fn check(summary: &str, exp: &Expectations) -> QualityIssues {
    let mut issues = QualityIssues { empty: summary.trim().is_empty(), ..QualityIssues::default() };
    let has_heading =
        |h: &str| summary.lines().any(|l| l.trim_end() == h || l.trim_end().starts_with(&format!("{h} ")));
    issues.missing_sections = exp.sections.iter().filter(|h| !has_heading(h)).map(|h| (*h).to_owned()).collect();
    issues.missing_identifiers = exp.identifiers.iter().filter(|i| !summary.contains(i.as_str())).cloned().collect();
    if let Some(req) = &exp.last_request {
        let words = keywords(req);
        if !words.is_empty() {
            let lower = summary.to_lowercase();
            let hits = words.iter().filter(|w| lower.contains(w.as_str())).count();
            if hits * 2 < words.len() {
                issues.missing_request = Some(req.clone());
            }
        }
    }
    issues
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn identifiers() {
        assert_eq!(
            identifiers_in("see src/module1.ts, ./a/b.rs and https://x.io/a?b=1. Also main.rs and 0190a5b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b"),
            vec!["src/module1.ts", "./a/b.rs", "https://x.io/a?b=1", "main.rs", "0190a5b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b"]
        );
    }

    #[test]
    fn guard_checks_sections_request_and_identifiers() {
        let msgs = [
            json!({"role":"user","content":"Fix the parser in src/parse.rs"}),
            json!({"role":"assistant","content":[{"type":"text","text":"Looking at src/parse.rs and docs/spec.md"}]}),
            json!({"role":"toolResult","content":[{"type":"text","text":"ignored/path.rs"}]}),
            json!({"role":"user","content":"Now migrate the logger configuration"}),
        ];
        let refs: Vec<&Value> = msgs.iter().collect();
        let exp = Expectations::from_messages(&refs, true, false);
        assert_eq!(exp.identifiers, vec!["src/parse.rs", "docs/spec.md"]);
        let good = "## Goal\nMigrate the logger configuration after fixing src/parse.rs (docs/spec.md)\n\
            ## Constraints & Preferences\n- (none)\n## Progress\n### Done\n- [x] parser\n## Key Decisions\n- none\n\
            ## Next Steps\n1. logger\n## Critical Context\n- (none)";
        assert!(check(good, &exp).is_ok(), "{:?}", check(good, &exp));
        let bad = "## Goal\nSomething else\n## Progress\nsrc/parse.rs";
        assert_eq!(
            check(bad, &exp),
            QualityIssues {
                missing_sections: vec![
                    "## Constraints & Preferences".into(),
                    "## Key Decisions".into(),
                    "## Next Steps".into(),
                    "## Critical Context".into()
                ],
                missing_identifiers: vec!["docs/spec.md".into()],
                missing_request: Some("Now migrate the logger configuration".into()),
                empty: false,
            }
        );
        assert!(check("  ", &Expectations::default()).empty);
    }
}
