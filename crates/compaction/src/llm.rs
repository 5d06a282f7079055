//! The one-shot, tool-less model call a summary needs, on top of `pincer-agent`'s `ModelStream`:
//! system prompt + one user message, `maxTokens` set through the model config, the response's text
//! blocks joined with `"\n"` as Pi's `completeSimple` callers do.

use crate::prompts::SummaryRequest;
use pincer_agent::message::{DraftBlock, StopReason};
use pincer_agent::{ModelRequest, ModelStream, ProviderError, ResolvedModel};

/// Why a summary call produced no summary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("the model ended the summary with stop reason `error`")]
    StoppedWithError,
}

/// `maxTokens` as sent: Pi's figure, lowered to the model's own output limit when one is configured.
pub fn effective_max_tokens(model: &ResolvedModel, requested: u64) -> u64 {
    match model.model.max_tokens {
        Some(limit) if limit > 0 => requested.min(limit),
        _ => requested,
    }
}

/// Sends `req` and returns the summary text.
pub async fn summarize(model: &ResolvedModel, req: &SummaryRequest) -> Result<String, CallError> {
    let mut model = model.clone();
    model.model.max_tokens = Some(effective_max_tokens(&model, req.max_tokens));
    let request = ModelRequest {
        system_prompt: Some(req.system_prompt.to_owned()),
        messages: vec![pincer_agent::ContextMessage::shared(req.user_message(pincer_pi::now_ms()))].into(),
        tools: Vec::new().into(),
    };
    let mut stream = ModelStream::open(&model, &request).await?;
    while stream.next().await?.is_some() {}
    let draft = stream.into_draft();
    if draft.stop_reason == Some(StopReason::Error) {
        return Err(CallError::StoppedWithError);
    }
    let texts: Vec<&str> = draft
        .blocks
        .iter()
        .filter_map(|b| match b {
            DraftBlock::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    Ok(texts.join("\n"))
}
