//! `[agents.defaults.compaction]` settings (`openclaw-gateway.md` §5) and the effective reserve
//! (`reserve_tokens_floor`, capped for small windows).

use crate::prepare::PrepareSettings;
use serde::Deserialize;

/// `default` is Pi's plain compaction; `safeguard` adds chunked summarization for histories too
/// large for the model and the quality guard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Default,
    #[default]
    Safeguard,
}

/// Compaction settings. Deserialize it from the `[agents.defaults.compaction]` table.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "RawSettings")]
pub struct CompactionSettings {
    pub mode: Mode,
    /// Pi's `reserveTokens`: headroom kept free in the context window.
    pub reserve_tokens: u64,
    /// OpenClaw's floor under the reserve (`0` disables it).
    pub reserve_tokens_floor: u64,
    /// Recent tail kept verbatim.
    pub keep_recent_tokens: u64,
    pub quality_guard_enabled: bool,
    /// Regenerations after a summary fails the quality guard.
    pub quality_guard_max_retries: u32,
    /// A compaction-only model (`provider/model`); the caller resolves it.
    pub model: Option<String>,
    /// Limit for the whole summarization (all model calls).
    pub timeout_seconds: u64,
    /// Appended to the history prompt as `Additional focus: …`.
    pub custom_instructions: Option<String>,
}

impl Default for CompactionSettings {
    fn default() -> Self {
        CompactionSettings {
            mode: Mode::Safeguard,
            reserve_tokens: 16384,
            reserve_tokens_floor: 20000,
            keep_recent_tokens: 20000,
            quality_guard_enabled: true,
            quality_guard_max_retries: 1,
            model: None,
            timeout_seconds: 180,
            custom_instructions: None,
        }
    }
}

#[derive(Deserialize, Default)]
struct RawGuard {
    enabled: Option<bool>,
    #[serde(alias = "maxRetries")]
    max_retries: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawSettings {
    mode: Option<Mode>,
    #[serde(alias = "reserveTokens")]
    reserve_tokens: Option<u64>,
    #[serde(alias = "reserveTokensFloor")]
    reserve_tokens_floor: Option<u64>,
    #[serde(alias = "keepRecentTokens")]
    keep_recent_tokens: Option<u64>,
    #[serde(alias = "qualityGuard")]
    quality_guard: Option<RawGuard>,
    model: Option<String>,
    #[serde(alias = "timeoutSeconds")]
    timeout_seconds: Option<u64>,
    #[serde(alias = "customInstructions")]
    custom_instructions: Option<String>,
}

impl From<RawSettings> for CompactionSettings {
    fn from(r: RawSettings) -> Self {
        let d = CompactionSettings::default();
        let guard = r.quality_guard.unwrap_or_default();
        CompactionSettings {
            mode: r.mode.unwrap_or(d.mode),
            reserve_tokens: r.reserve_tokens.unwrap_or(d.reserve_tokens),
            reserve_tokens_floor: r.reserve_tokens_floor.unwrap_or(d.reserve_tokens_floor),
            keep_recent_tokens: r.keep_recent_tokens.unwrap_or(d.keep_recent_tokens),
            quality_guard_enabled: guard.enabled.unwrap_or(d.quality_guard_enabled),
            quality_guard_max_retries: guard.max_retries.unwrap_or(d.quality_guard_max_retries),
            model: r.model.filter(|m| !m.trim().is_empty()),
            timeout_seconds: r.timeout_seconds.filter(|&t| t > 0).unwrap_or(d.timeout_seconds),
            custom_instructions: r.custom_instructions.filter(|c| !c.is_empty()),
        }
    }
}

impl CompactionSettings {
    /// `max(reserve_tokens, floor)`, the floor capped at `window − min(8000, ⌊window × 0.5⌋)` so a
    /// small window keeps room for the conversation.
    pub fn effective_reserve(&self, context_window: u64) -> u64 {
        let cap = context_window.saturating_sub(8000.min(context_window / 2));
        self.reserve_tokens.max(self.reserve_tokens_floor.min(cap))
    }

    /// The settings `prepare_compaction` gets for a model with this context window (`None`: unknown,
    /// the configured reserve is used as is).
    pub fn prepare_settings(&self, context_window: Option<u64>) -> PrepareSettings {
        let reserve = match context_window {
            Some(w) => self.effective_reserve(w),
            None => self.reserve_tokens.max(self.reserve_tokens_floor),
        };
        PrepareSettings { reserve_tokens: reserve, keep_recent_tokens: self.keep_recent_tokens }
    }

    /// The quality guard runs in `safeguard` mode when enabled.
    pub fn guard_active(&self) -> bool {
        self.mode == Mode::Safeguard && self.quality_guard_enabled
    }

    /// Pi's threshold after a turn: `tokens > window − effective reserve` (strict).
    pub fn over_threshold(&self, context_tokens: u64, context_window: u64) -> bool {
        crate::tokens::should_compact(context_tokens, context_window, self.effective_reserve(context_window), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Root {
        agents: Agents,
    }
    #[derive(Deserialize)]
    struct Agents {
        defaults: Defaults,
    }
    #[derive(Deserialize)]
    struct Defaults {
        #[serde(default)]
        compaction: CompactionSettings,
    }

    fn parse(toml_text: &str) -> CompactionSettings {
        toml::from_str::<Root>(toml_text).unwrap().agents.defaults.compaction
    }

    #[test]
    fn defaults_and_toml() {
        assert_eq!(parse("[agents.defaults]\n"), CompactionSettings::default());
        let s = parse(
            r#"
[agents.defaults.compaction]
mode = "default"
reserve_tokens = 1000
reserve_tokens_floor = 0
keep_recent_tokens = 500
model = "openai/gpt-mini"
timeout_seconds = 30
custom_instructions = "keep the SQL"

[agents.defaults.compaction.quality_guard]
enabled = false
max_retries = 3
"#,
        );
        assert_eq!(
            s,
            CompactionSettings {
                mode: Mode::Default,
                reserve_tokens: 1000,
                reserve_tokens_floor: 0,
                keep_recent_tokens: 500,
                quality_guard_enabled: false,
                quality_guard_max_retries: 3,
                model: Some("openai/gpt-mini".into()),
                timeout_seconds: 30,
                custom_instructions: Some("keep the SQL".into()),
            }
        );
        assert!(toml::from_str::<Root>("[agents.defaults.compaction]\nmode = \"fast\"\n").is_err());
    }

    #[test]
    fn effective_reserve_caps_the_floor_for_small_windows() {
        let s = CompactionSettings::default();
        let got: Vec<u64> = [200_000u64, 32_000, 16_000, 10_000, 0].iter().map(|&w| s.effective_reserve(w)).collect();
        // 200k: max(16384, 20000); 32k: floor capped at 24000 → 20000; 16k: cap 8000 → 16384;
        // 10k: cap 5000 → 16384; 0: cap 0 → 16384.
        assert_eq!(got, vec![20000, 20000, 16384, 16384, 16384]);
        let no_floor = CompactionSettings { reserve_tokens_floor: 0, reserve_tokens: 1000, ..s.clone() };
        assert_eq!(no_floor.effective_reserve(200_000), 1000);
        let big_floor = CompactionSettings { reserve_tokens_floor: 30_000, reserve_tokens: 1000, ..s };
        assert_eq!(big_floor.effective_reserve(40_000), 30_000);
        assert_eq!(big_floor.effective_reserve(20_000), 12_000);
    }
}
