//! Pi-compatible compaction of session transcripts.
//!
//! A long session is compacted by appending ONE `compaction` entry whose `summary` replaces the
//! history before `firstKeptEntryId` in the context Pi (and Pincer) build from the file. Nothing is
//! deleted or rewritten, and a failed, timed-out or aborted compaction writes nothing.
//!
//! Layout:
//! - `pincer_pi`: the JavaScript semantics and `convertToLlm`, shared with the agent.
//! - [`tokens`]: `estimateTokens`, `calculateContextTokens`, `estimateContextTokens`, `shouldCompact`.
//! - [`prepare`]: `findCutPoint`, `prepareCompaction` (pure, exactly Pi 0.73.1).
//! - [`serialize`]: `serializeConversation`, file-operation lists.
//! - [`prompts`]: the prompt texts and the summary requests (`build_summary_request`).
//! - [`settings`]: `[agents.defaults.compaction]` and the effective reserve.
//! - [`guard`]: the safeguard quality guard.
//! - [`llm`]: the one-shot summary call over `pincer-agent`.
//! - [`compact`]: the whole pipeline, ending in one append through `pincer-store`.

pub mod compact;
pub mod guard;
pub mod llm;
pub mod prepare;
mod prompt_texts;
pub mod prompts;
pub mod serialize;
pub mod settings;
pub mod tokens;

pub use compact::{
    already_compacted, compact, compact_with, load_compaction_path, load_path, plan_history_stages, summarize,
    CompactionError, CompactionOutcome, CompactionReason, CompactionWriter, LoadedPath, StoreWriter,
};
pub use prepare::{
    entry_tokens, find_cut_point, find_turn_start_index, path_context_messages, prepare_compaction, CutPoint,
    Preparation, PrepareSettings,
};
pub use prompts::{
    build_summary_request, history_request, merge_summaries, turn_prefix_request, SummaryKind, SummaryRequest,
    SUMMARIZATION_PROMPT, SUMMARIZATION_SYSTEM_PROMPT, TURN_PREFIX_SUMMARIZATION_PROMPT, UPDATE_SUMMARIZATION_PROMPT,
};
pub use serialize::{
    compute_file_lists, convert_to_llm, format_file_operations, serialize_conversation, FileLists, FileOps,
};
pub use settings::{CompactionSettings, Mode};
pub use tokens::{
    assistant_usage, calculate_context_tokens, estimate_context_tokens, estimate_tokens, should_compact,
    ContextEstimate,
};
