//! Token usage as the transcripts record it (each assistant message's `usage`), in OpenClaw's
//! shapes: `sessions.usage` (per session and in total, for the usage view), `usage.status`
//! (provider quota windows: Pincer tracks none), and the last turn's usage and context tokens
//! that session rows show.

use crate::error::EngineError;
use crate::protocol::{
    MessageCounts, SessionUsage, SessionUsageDetail, SessionsUsage, UsageAggregates, UsageStatus, UsageTotals,
};
use crate::sessions::SessionRef;
use crate::state::{is_injected, Engine};
use pincer_store::Transcripts;
use serde_json::{json, Value};
use std::path::Path;

/// Largest transcript read for usage.
const MAX_BYTES: u64 = 16 * 1024 * 1024;

/// The usage of one transcript's assistant messages: the tokens and cost they report, the messages
/// by role, and the last turn's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Usage {
    pub totals: UsageTotals,
    pub counts: MessageCounts,
    /// The last assistant message's usage: what the context held at the last turn.
    pub last: Option<Value>,
    pub last_at: Option<u64>,
}

impl Usage {
    /// Prompt tokens of the last turn (input + cached): the context's size then.
    pub fn context_tokens(&self) -> Option<u64> {
        let l = self.last.as_ref()?;
        let n = |k: &str| l.get(k).and_then(Value::as_u64).unwrap_or(0);
        Some(n("input") + n("cacheRead") + n("cacheWrite") + n("output"))
    }

    fn add(&mut self, other: &Usage) {
        let (t, o) = (&mut self.totals, &other.totals);
        t.input += o.input;
        t.output += o.output;
        t.cache_read += o.cache_read;
        t.cache_write += o.cache_write;
        t.total_tokens += o.total_tokens;
        t.total_cost += o.total_cost;
        let (c, o) = (&mut self.counts, &other.counts);
        c.total += o.total;
        c.user += o.user;
        c.assistant += o.assistant;
        c.errors += o.errors;
    }
}

/// Reads a transcript's usage (a transcript too large to read, or unreadable, counts nothing).
pub fn of_transcript(store: &dyn Transcripts, path: &Path) -> Usage {
    store.read_bytes(path, MAX_BYTES).ok().flatten().map(|b| scan(&b)).unwrap_or_default()
}

/// Bytes read from a transcript's end for a session row's last-turn usage.
const TAIL_BYTES: u64 = 256 * 1024;

/// The usage of a transcript's last [`TAIL_BYTES`] (cheap for every row of `sessions.list`):
/// `last` is the last turn's usage; the counts cover the tail only.
pub fn of_tail(store: &dyn Transcripts, path: &Path) -> Usage {
    store.read_tail(path, TAIL_BYTES).ok().flatten().map(|b| scan(&b)).unwrap_or_default()
}

fn scan(bytes: &[u8]) -> Usage {
    let mut u = Usage::default();
    for line in bytes.split(|b| *b == b'\n') {
        let has = |needle: &[u8]| line.windows(needle.len()).any(|w| w == needle);
        if !has(b"\"type\":\"message\"") {
            continue;
        }
        let Ok(entry) = serde_json::from_slice::<Value>(line) else { continue };
        let m = &entry["message"];
        match m["role"].as_str() {
            Some("user") => {
                u.counts.user += 1;
                u.counts.total += 1;
            }
            Some("assistant") => {
                u.counts.assistant += 1;
                u.counts.total += 1;
                if m["stopReason"] == "error" {
                    u.counts.errors += 1;
                }
                let usage = &m["usage"];
                if usage.is_object() {
                    let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
                    let t = &mut u.totals;
                    t.input += n("input");
                    t.output += n("output");
                    t.cache_read += n("cacheRead");
                    t.cache_write += n("cacheWrite");
                    t.total_tokens += n("totalTokens");
                    t.total_cost += usage["cost"]["total"].as_f64().unwrap_or(0.0);
                }
                // What the context held: an aborted or failed reply's usage does not say (as Pi's
                // `getLastAssistantUsage`), nor does an injected note or an abort's kept partial, so
                // the token bar keeps the last complete turn's.
                let reported = pincer_compaction::tokens::assistant_usage(m).filter(|_| !is_injected(m));
                if let Some(usage) = reported {
                    u.last = Some(usage.clone());
                    u.last_at = m["timestamp"].as_u64();
                }
            }
            _ => {}
        }
    }
    u
}

/// The token fields of a session row: the last turn's usage and the context against the window.
pub fn row_fields(gw: &Engine, s: &SessionRef, u: &Usage) -> Value {
    let model = gw.session_model(s);
    let window = gw.settings.providers.resolve(&model).ok().and_then(|m| m.model.context_window);
    let last = u.last.as_ref();
    let n = |k: &str| last.and_then(|l| l.get(k)).and_then(Value::as_u64);
    json!({"inputTokens": n("input"), "outputTokens": n("output"), "cacheRead": n("cacheRead"),
        "cacheWrite": n("cacheWrite"), "totalTokens": u.context_tokens(), "totalTokensFresh": last.is_some(),
        "contextTokens": window})
}

/// `sessions.usage`: per-session usage (of session `key`, else of every session of `agent`, else of
/// all; at most `limit` rows), totals and aggregates.
pub fn sessions_usage(
    gw: &Engine,
    key: Option<&str>,
    agent: Option<&crate::sessions::AgentId>,
    limit: usize,
) -> Result<Value, EngineError> {
    let list = match key {
        Some(k) => gw.sessions.resolve(k, false)?.into_iter().collect(),
        None => gw.sessions.list(agent)?,
    };
    let mut total = Usage::default();
    let mut rows = Vec::new();
    for s in list.iter() {
        let u = of_transcript(gw.store.as_ref(), &s.path);
        total.add(&u);
        if rows.len() < limit {
            rows.push((s, u, s.model()));
        }
    }
    let today = chrono_free_date(pincer_pi::now_ms());
    let sessions = rows
        .iter()
        .map(|(s, u, m)| {
            let (model_provider, model) = match m.as_deref() {
                Some(m) => match m.split_once('/') {
                    Some((p, m)) => (Some(p), Some(m)),
                    None => (None, Some(m)),
                },
                None => (None, None),
            };
            SessionUsage {
                key: &s.key,
                label: s.entry.get("label"),
                session_id: &s.session_id,
                updated_at: s.entry.get("updatedAt"),
                agent_id: &s.agent_id,
                chat_type: "direct",
                model_provider,
                model,
                usage: SessionUsageDetail {
                    totals: u.totals.clone(),
                    message_counts: u.counts.clone(),
                    last_activity: u.last_at,
                },
                has_context_weight: false,
            }
        })
        .collect();
    let answer = SessionsUsage {
        updated_at: pincer_pi::now_ms(),
        start_date: &today,
        end_date: &today,
        sessions,
        totals: total.totals,
        aggregates: UsageAggregates { messages: total.counts, ..UsageAggregates::default() },
        creator_options: [],
    };
    serde_json::to_value(answer).map_err(|e| EngineError::Internal(format!("the usage answer: {e}")))
}

/// `YYYY-MM-DD` (UTC) of a time in ms since the epoch.
fn chrono_free_date(ms: u64) -> String {
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = (ms / 86_400_000) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

/// `usage.status`: provider quota windows (Pincer tracks none).
pub fn usage_status() -> Value {
    serde_json::to_value(UsageStatus { updated_at: pincer_pi::now_ms(), providers: [] }).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates() {
        assert_eq!(super::chrono_free_date(0), "1970-01-01");
        assert_eq!(super::chrono_free_date(1_780_000_000_000), "2026-05-28");
        assert_eq!(super::chrono_free_date(951_782_400_000), "2000-02-29");
    }

    #[test]
    fn an_aborted_reply_keeps_the_last_complete_turns_usage() {
        let row = |stop: &str, input: u64, ts: u64| {
            serde_json::json!({"type": "message", "message": {"role": "assistant", "stopReason": stop, "timestamp": ts,
                "usage": {"input": input, "output": 1, "totalTokens": input + 1}}})
            .to_string()
        };
        let partial = serde_json::json!({"type": "message",
            "message": crate::state::injected_message("word0 word1", Some("r:assistant"), None)})
        .to_string();
        let lines = [row("stop", 180, 1), row("aborted", 0, 2), row("error", 0, 3), partial].join("\n");
        let u = super::scan(lines.as_bytes());
        assert_eq!((u.counts.assistant, u.counts.errors, u.totals.input, u.totals.output), (4, 1, 180, 3));
        assert_eq!((u.last.as_ref().map(|l| l["input"].clone()), u.last_at), (Some(180.into()), Some(1)));
    }
}
