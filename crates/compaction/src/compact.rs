//! `compact()`: read a transcript, prepare as Pi does, summarize (safeguard: in stages when the
//! history is too large for the model, with the quality guard and regenerations), and append ONE
//! `compaction` entry through the store. Every failure — provider error, timeout, abort, a summary
//! the guard keeps rejecting, a transcript that changed meanwhile — returns an error before anything
//! is written.

use crate::guard::{self, Expectations, QualityIssues};
use crate::llm::{self, CallError};
use crate::prepare::{prepare_compaction, Preparation};
use crate::prompts::{self, merge_summaries, SummaryRequest, SUMMARIZATION_SYSTEM_PROMPT, UPDATE_SUMMARIZATION_PROMPT};
use crate::serialize::{convert_to_llm, serialize_conversation, FileLists};
use crate::settings::{CompactionSettings, Mode};
use pincer_agent::{CancellationToken, ResolvedModel};
use pincer_pi::js::utf16_len;
use pincer_store::{Appended, Kind, Leaf, NewEntry, Session, StoreError, Transcripts, TranscriptsExt};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Why a compaction runs (echoed in the outcome for the gateway's events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompactionReason {
    /// Context tokens over `window − effective reserve` after a turn.
    Threshold,
    /// The provider rejected a request as too long (the turn is retried once afterwards).
    Overflow,
    /// `/compact`, `sessions.compact`, the CLI.
    Manual,
}

impl CompactionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionReason::Threshold => "threshold",
            CompactionReason::Overflow => "overflow",
            CompactionReason::Manual => "manual",
        }
    }
}

/// A compaction that was written.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactionOutcome {
    /// The `compaction` entry exactly as it is on disk.
    pub entry: Value,
    pub tokens_before: u64,
    pub first_kept_entry_id: String,
    pub details: FileLists,
    pub reason: CompactionReason,
    /// Messages summarized (history + turn prefix).
    pub summarized_messages: usize,
    /// Model calls made, regenerations and stages included.
    pub model_calls: usize,
    /// Summary generations (1 + regenerations after the quality guard rejected one).
    pub attempts: u32,
    /// History stages (1 unless the safeguard chunked the history).
    pub stages: usize,
}

/// Why nothing was written. Every variant leaves the transcript byte-identical.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error("Already compacted")]
    AlreadyCompacted,
    #[error("Nothing to compact (session too small)")]
    NothingToCompact,
    #[error("transcript {0}: a parentId cycle is reachable from the leaf; run `pincer transcript repair` first")]
    Cycle(String),
    #[error("compaction failed: the {what} summary call failed: {source}; the transcript was not changed")]
    Summary { what: &'static str, source: CallError },
    #[error("compaction timed out after {0}s (timeout_seconds); the transcript was not changed")]
    Timeout(u64),
    #[error("compaction aborted; the transcript was not changed")]
    Aborted,
    #[error(
        "compaction cancelled: the summary failed the quality guard {attempts} time(s) ({issues}); the transcript was not changed"
    )]
    QualityGuard { attempts: u32, issues: String },
    #[error("compaction failed: the model returned an empty summary; the transcript was not changed")]
    EmptySummary,
    #[error(
        "compaction failed: the model's context window ({window} tokens) leaves no room to summarize in stages; the transcript was not changed"
    )]
    ContextTooSmall { window: u64 },
    #[error("compaction cancelled: the transcript changed while the summary was generated (leaf {before:?} → {now:?}); nothing was written")]
    TranscriptChanged { before: Option<String>, now: Option<String> },
    #[error("compaction failed writing the entry: {0}")]
    Store(#[from] StoreError),
    #[error("compaction failed: {0}")]
    Internal(String),
}

/// The active path of a transcript, decoded.
pub struct LoadedPath {
    /// Root→leaf entries.
    pub entries: Vec<Value>,
    /// The leaf id new entries chain to.
    pub leaf_id: Option<String>,
}

/// Reads `file` and decodes its active path (as Pi's `getBranch()`).
pub fn load_path(file: &Path) -> Result<LoadedPath, CompactionError> {
    load(Session::read(file)?, file, false)
}

/// [`load_path`] for [`prepare_compaction`]: the entries before the previous compaction's kept
/// boundary (Pi's `boundaryStart`, the entry its `firstKeptEntryId` names) are left `null`
/// without being decoded, since preparing reads nothing before it: only that compaction, its kept
/// range and what follows. A long session compacted before then costs the decoding of its recent
/// part only. (Ids that are not strings, or a boundary not on the path: everything is decoded.)
pub fn load_compaction_path(file: &Path) -> Result<LoadedPath, CompactionError> {
    load(Session::read(file)?, file, true)
}

fn load(session: Option<Session>, file: &Path, from_boundary: bool) -> Result<LoadedPath, CompactionError> {
    let Some((session, &Leaf::Entry(leaf))) = session.as_ref().map(|s| (s, &s.leaf)) else {
        return Ok(LoadedPath { entries: Vec::new(), leaf_id: None });
    };
    let (path, cycle) = session.path_from(leaf);
    if cycle {
        return Err(CompactionError::Cycle(file.display().to_string()));
    }
    let skip = if from_boundary { unread_prefix(session, &path) } else { 0 };
    let entries = path
        .iter()
        .enumerate()
        .map(|(pos, &i)| if pos < skip { Value::Null } else { session.value(i).unwrap_or(Value::Null) })
        .collect();
    Ok(LoadedPath { entries, leaf_id: session.leaf_id().map(str::to_owned) })
}

/// How many leading path entries preparing a compaction never reads: those before both the last
/// compaction's first kept entry (the first entry of the path with that id, as Pi finds it) and
/// the first compaction of the path with the last one's id (Pi's context building finds the
/// compaction again by id). Only the entry index is consulted; 0 when an id is not a string.
fn unread_prefix(s: &Session, path: &[usize]) -> usize {
    let id_is = |i: usize, id: &str| s.entries[i].id.as_deref() == Some(id);
    let Some(last) = path.iter().rposition(|&i| s.entries[i].kind == Kind::Compaction) else { return 0 };
    let Some(c) = s.value(path[last]) else { return 0 };
    let (Some(Value::String(first_kept)), Some(Value::String(id))) = (c.get("firstKeptEntryId"), c.get("id")) else {
        return 0;
    };
    let Some(boundary) = path.iter().position(|&i| id_is(i, first_kept)) else { return 0 };
    let again = path.iter().position(|&i| s.entries[i].kind == Kind::Compaction && id_is(i, id)).unwrap_or(last);
    boundary.min(again)
}

/// True when the path ends in a compaction, ignoring trailing `custom` entries (OpenClaw's
/// `openclaw.cache-ttl` markers): compacting again would only re-summarize the kept tail.
pub fn already_compacted(path: &[Value]) -> bool {
    path.iter()
        .rev()
        .map(|e| e.get("type").and_then(Value::as_str).unwrap_or(""))
        .find(|t| *t != "custom")
        .is_some_and(|t| t == "compaction")
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, CompactionError> + Send + 'static,
) -> Result<T, CompactionError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| CompactionError::Internal(format!("worker task failed: {e}")))?
}

/// Where a compaction's entry goes: appended to the transcript only while its leaf is still
/// `leaf` (the one the summary was made from; else [`StoreError::LeafMoved`], and nothing is
/// written). The gateway writes through the session's owner; [`StoreWriter`] writes straight to a
/// store (the CLI).
pub trait CompactionWriter: Send + Sync {
    fn append_at_leaf(
        &self,
        entry: NewEntry,
        leaf: Option<String>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Appended, StoreError>> + Send + '_>>;
}

/// A [`CompactionWriter`] over a store: the transcript's lock, its leaf checked, the append.
pub struct StoreWriter<S> {
    pub store: S,
    pub path: PathBuf,
}

impl<S: Transcripts + Clone + 'static> CompactionWriter for StoreWriter<S> {
    fn append_at_leaf(
        &self,
        entry: NewEntry,
        leaf: Option<String>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Appended, StoreError>> + Send + '_>> {
        let (store, path) = (self.store.clone(), self.path.clone());
        Box::pin(async move {
            let write = move || {
                let _guard = store.lock(&path)?;
                let now = store.leaf(&path)?;
                if now != leaf {
                    return Err(StoreError::LeafMoved { expected: leaf, now });
                }
                store.append(&path, entry)
            };
            tokio::task::spawn_blocking(write)
                .await
                .map_err(|e| StoreError::Internal(format!("worker task failed: {e}")))?
        })
    }
}

/// Compacts the transcript at `file` with `model`, its entry written straight to `store`; see the
/// module docs.
pub async fn compact<S: Transcripts + Clone + 'static>(
    file: &Path,
    store: &S,
    model: &ResolvedModel,
    settings: &CompactionSettings,
    reason: CompactionReason,
    cancel: CancellationToken,
) -> Result<CompactionOutcome, CompactionError> {
    let writer = StoreWriter { store: store.clone(), path: file.to_owned() };
    compact_with(file, store, &writer, model, settings, reason, cancel).await
}

/// [`compact`], its entry written by `writer`.
pub async fn compact_with<S: Transcripts + Clone + 'static>(
    file: &Path,
    store: &S,
    writer: &dyn CompactionWriter,
    model: &ResolvedModel,
    settings: &CompactionSettings,
    reason: CompactionReason,
    cancel: CancellationToken,
) -> Result<CompactionOutcome, CompactionError> {
    let path: PathBuf = file.to_owned();
    let prep_settings = settings.prepare_settings(model.model.context_window);
    let reader = store.clone();
    let (loaded, prep) = blocking(move || {
        let loaded = load(reader.read_session(&path)?, &path, true)?;
        if already_compacted(&loaded.entries) {
            return Err(CompactionError::AlreadyCompacted);
        }
        let prep = prepare_compaction(&loaded.entries, prep_settings).ok_or(CompactionError::NothingToCompact)?;
        Ok((loaded, prep))
    })
    .await?;
    let leaf_before = loaded.leaf_id.clone();
    drop(loaded);

    let timeout = Duration::from_secs(settings.timeout_seconds.max(1));
    let work = summarize(model, settings, &prep);
    let summarized = tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(CompactionError::Aborted),
        r = tokio::time::timeout(timeout, work) => match r {
            Err(_) => Err(CompactionError::Timeout(settings.timeout_seconds)),
            Ok(r) => r,
        },
    }?;

    let details = prep.details();
    let mut payload = Map::new();
    payload.insert("summary".into(), Value::String(summarized.summary));
    payload.insert("firstKeptEntryId".into(), Value::String(prep.first_kept_entry_id.clone()));
    payload.insert("tokensBefore".into(), json!(prep.tokens_before));
    payload.insert("details".into(), json!({"readFiles": details.read_files, "modifiedFiles": details.modified_files}));
    payload.insert("fromHook".into(), Value::Bool(false));

    // Last chance to stop; after this the entry is written.
    if cancel.is_cancelled() {
        return Err(CompactionError::Aborted);
    }
    let appended = match writer.append_at_leaf(NewEntry::of("compaction", payload), leaf_before).await {
        Ok(a) => a,
        Err(StoreError::LeafMoved { expected, now }) => {
            return Err(CompactionError::TranscriptChanged { before: expected, now })
        }
        Err(e) => return Err(e.into()),
    };

    Ok(CompactionOutcome {
        entry: appended.entry,
        tokens_before: prep.tokens_before,
        first_kept_entry_id: prep.first_kept_entry_id.clone(),
        details,
        reason,
        summarized_messages: prep.messages_to_summarize.len() + prep.turn_prefix_messages.len(),
        model_calls: summarized.calls,
        attempts: summarized.attempts,
        stages: summarized.stages,
    })
}

/// The summary as it will be stored, and how it was obtained.
pub struct Summarized {
    pub summary: String,
    pub calls: usize,
    pub attempts: u32,
    pub stages: usize,
}

/// Pi's token estimate for a prompt text, with a 20% margin (chars/4 undercounts code and JSON).
fn est(text_len_utf16: usize) -> u64 {
    (text_len_utf16 as u64).div_ceil(4) * 6 / 5
}

/// Conversation chunks for a staged history summary, never splitting a tool call from its results
/// (a chunk boundary only falls before a message that is not a `toolResult`). One chunk when the
/// whole history fits, or when the model's window is unknown or the mode is `default`.
pub fn plan_history_stages(
    prep: &Preparation,
    model: &ResolvedModel,
    settings: &CompactionSettings,
) -> Result<Vec<String>, CompactionError> {
    let whole = serialize_conversation(&convert_to_llm(&prep.messages_to_summarize));
    let window = match (settings.mode, model.model.context_window) {
        (Mode::Safeguard, Some(w)) => w,
        _ => return Ok(vec![whole]),
    };
    let max_tokens = llm::effective_max_tokens(
        model,
        prompts::history_request_from_text("", prep.settings.reserve_tokens, None, None).max_tokens,
    );
    let fixed = est(utf16_len(SUMMARIZATION_SYSTEM_PROMPT))
        + est(utf16_len(UPDATE_SUMMARIZATION_PROMPT))
        + est(settings.custom_instructions.as_deref().map(utf16_len).unwrap_or(0))
        + 512;
    let input_budget = window.saturating_sub(max_tokens).saturating_sub(fixed);
    let prev = prep.previous_summary.as_deref().map(utf16_len).unwrap_or(0);
    if est(utf16_len(&whole) + prev) <= input_budget {
        return Ok(vec![whole]);
    }
    // Each stage carries the running summary (at most max_tokens, or the previous one).
    let per_chunk = input_budget.saturating_sub(max_tokens.max(est(prev)));
    if per_chunk < 256 {
        return Err(CompactionError::ContextTooSmall { window });
    }
    let mut units: Vec<Vec<&Value>> = Vec::new();
    for m in &prep.messages_to_summarize {
        let is_result = m.get("role").and_then(Value::as_str) == Some("toolResult");
        match units.last_mut() {
            Some(u) if is_result => u.push(m),
            _ => units.push(vec![m]),
        }
    }
    let mut chunks: Vec<String> = Vec::new();
    let mut current = String::new();
    for u in units {
        let text = serialize_conversation(&convert_to_llm(&u));
        if text.is_empty() {
            continue;
        }
        let joined = if current.is_empty() { 0 } else { utf16_len(&current) + 2 };
        if !current.is_empty() && est(joined + utf16_len(&text)) > per_chunk {
            chunks.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push_str("\n\n");
        }
        current.push_str(&text);
    }
    if !current.is_empty() || chunks.is_empty() {
        chunks.push(current);
    }
    Ok(chunks)
}

async fn call(
    model: &ResolvedModel,
    req: &SummaryRequest,
    what: &'static str,
    calls: &AtomicUsize,
) -> Result<String, CompactionError> {
    calls.fetch_add(1, Ordering::Relaxed);
    llm::summarize(model, req).await.map_err(|source| CompactionError::Summary { what, source })
}

/// Runs the history stages: the first with the preparation's previous summary, each later one
/// updating the running summary (the UPDATE prompt with `<previous-summary>`).
async fn history_summary(
    model: &ResolvedModel,
    prep: &Preparation,
    settings: &CompactionSettings,
    stages: &[String],
    feedback: &str,
    calls: &AtomicUsize,
) -> Result<String, CompactionError> {
    let mut running = prep.previous_summary.clone();
    for (i, chunk) in stages.iter().enumerate() {
        let mut req = prompts::history_request_from_text(
            chunk,
            prep.settings.reserve_tokens,
            running.as_deref(),
            settings.custom_instructions.as_deref(),
        );
        if i + 1 == stages.len() {
            req.text.push_str(feedback);
        }
        running = Some(call(model, &req, "history", calls).await?);
    }
    Ok(running.unwrap_or_default())
}

/// Generates the summary for `prep` (history and split-turn prefix in parallel, merged as Pi does,
/// file lists appended), regenerating while the quality guard rejects it.
pub async fn summarize(
    model: &ResolvedModel,
    settings: &CompactionSettings,
    prep: &Preparation,
) -> Result<Summarized, CompactionError> {
    let split = prep.is_split_turn && !prep.turn_prefix_messages.is_empty();
    let need_history = !split || !prep.messages_to_summarize.is_empty();
    let stages = if need_history { plan_history_stages(prep, model, settings)? } else { Vec::new() };
    let all: Vec<&Value> = prep.messages_to_summarize.iter().chain(&prep.turn_prefix_messages).collect();
    let expect = Expectations::from_messages(&all, need_history, split);
    let suffix = prep.file_ops_suffix();
    // Pi writes "No prior history." when a split turn has no earlier messages, dropping the previous
    // summary; safeguard mode carries the previous summary over instead (without its file lists,
    // which are merged into the new ones).
    let carry_previous = match (&prep.previous_summary, settings.mode) {
        (Some(prev), Mode::Safeguard) if split && !need_history => Some(strip_file_lists(prev).to_owned()),
        _ => None,
    };
    let guard_on = settings.guard_active();
    let tries = if guard_on { settings.quality_guard_max_retries + 1 } else { 1 };
    let calls = AtomicUsize::new(0);
    let mut feedback = String::new();
    let mut last = QualityIssues::default();
    for attempt in 1..=tries {
        let history = async {
            if carry_previous.is_some() {
                Ok(carry_previous.clone())
            } else if need_history {
                history_summary(model, prep, settings, &stages, &feedback, &calls).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let prefix = async {
            if split {
                let mut req = prompts::turn_prefix_request(&prep.turn_prefix_messages, prep.settings.reserve_tokens);
                req.text.push_str(&feedback);
                call(model, &req, "turn-prefix", &calls).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let (history, prefix) = futures::future::try_join(history, prefix).await?;
        let empty = [&history, &prefix].iter().any(|p| p.as_deref().is_some_and(|t| t.trim().is_empty()));
        let summary = merge_summaries(history.as_deref(), prefix.as_deref(), &suffix);
        if !guard_on {
            if empty {
                return Err(CompactionError::EmptySummary);
            }
            return Ok(Summarized { summary, calls: calls.into_inner(), attempts: attempt, stages: stages.len() });
        }
        let mut issues = guard::check(&summary, &expect);
        issues.empty |= empty;
        if issues.is_ok() {
            return Ok(Summarized { summary, calls: calls.into_inner(), attempts: attempt, stages: stages.len() });
        }
        tracing::warn!(attempt, tries, issues = %issues.describe(), "compaction summary rejected by the quality guard");
        feedback = issues.retry_instructions();
        last = issues;
    }
    Err(CompactionError::QualityGuard { attempts: tries, issues: last.describe() })
}

/// A summary without the `<read-files>`/`<modified-files>` blocks `formatFileOperations` appended.
pub fn strip_file_lists(summary: &str) -> &str {
    let mut s = summary;
    for tag in ["modified-files", "read-files"] {
        let open = format!("\n\n<{tag}>\n");
        if s.ends_with(&format!("\n</{tag}>")) {
            if let Some(i) = s.rfind(&open) {
                s = &s[..i];
            }
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_trailing_file_lists_only() {
        let with = "## Goal\nx\n\n<read-files>\na\n</read-files>\n\n<modified-files>\nb\n</modified-files>";
        let got = [
            strip_file_lists(with),
            strip_file_lists("## Goal\nx\n\n<modified-files>\nb\n</modified-files>"),
            strip_file_lists("## Goal\nx"),
        ];
        assert_eq!(got, ["## Goal\nx", "## Goal\nx", "## Goal\nx"]);
    }

    #[test]
    fn already_compacted_ignores_trailing_custom_entries() {
        use serde_json::json;
        let c = json!({"type":"compaction"});
        let m = json!({"type":"message"});
        let k = json!({"type":"custom"});
        let got = [
            already_compacted(&[m.clone(), c.clone()]),
            already_compacted(&[m.clone(), c.clone(), k.clone(), k.clone()]),
            already_compacted(&[c.clone(), m.clone(), k.clone()]),
            already_compacted(&[]),
        ];
        assert_eq!(got, [true, true, false, false]);
    }
}
