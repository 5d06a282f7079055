//! `[channels.*]` of `pincer.toml`: each messaging platform's section as written and validated
//! (tokens from the environment, who may talk to the agent, which agent answers). The adapters
//! that use them live in the gateway crate (`pincer_gateway::channels`).

use crate::sessions::AgentId;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// `[channels]`: one optional section per platform.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelsSection {
    pub telegram: Option<TelegramSection>,
    pub matrix: Option<MatrixSection>,
}

/// The validated `[channels]`.
#[derive(Debug, Default, Clone)]
pub struct ChannelSettings {
    /// `[channels.telegram]`, when enabled.
    pub telegram: Option<TelegramSettings>,
    /// `[channels.matrix]`, when enabled.
    pub matrix: Option<MatrixSettings>,
}

impl ChannelSettings {
    /// Validates `[channels]`; errors name the section and the field.
    pub fn parse(section: &ChannelsSection) -> Result<ChannelSettings, String> {
        let telegram = match &section.telegram {
            Some(t) => TelegramSettings::parse(t)?,
            None => None,
        };
        let matrix = match &section.matrix {
            Some(m) => MatrixSettings::parse(m)?,
            None => None,
        };
        Ok(ChannelSettings { telegram, matrix })
    }

    /// Secrets of the channels (tokens), for the redactor.
    pub fn secrets(&self) -> Vec<String> {
        let mut out: Vec<String> = self.telegram.iter().map(|t| t.token.clone()).collect();
        out.extend(self.telegram.iter().filter_map(|t| t.webhook.as_ref().map(|(_, s)| s.clone())));
        out.extend(self.matrix.iter().map(|m| m.token.clone()));
        out
    }
}

/// Who may talk to the agent through a channel, and which agent answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Platform user ids and `@usernames` (lowercase) allowed; `*` is anyone. Empty: nobody.
    pub allow_from: Vec<String>,
    /// The agent of conversations without a binding.
    pub agent: AgentId,
    /// A conversation (peer or chat id, or `@username`) → its agent.
    pub bindings: BTreeMap<String, AgentId>,
}

impl Policy {
    /// Validates a channel's common fields; `section` (e.g. `[channels.telegram]`) names errors.
    pub fn parse(
        section: &str,
        allow_from: &[String],
        agent: Option<&str>,
        bindings: &BTreeMap<String, String>,
    ) -> Result<Policy, String> {
        let agent_id = |a: &str, field: &str| {
            AgentId::parse(a).map_err(|e| format!("{section}: {field} {a:?} is not an agent id: {e}"))
        };
        let mut allow = Vec::new();
        for a in allow_from {
            let a = a.trim();
            if a.is_empty() {
                return Err(format!("{section}: allow_from has an empty entry"));
            }
            allow.push(a.to_lowercase());
        }
        let mut b = BTreeMap::new();
        for (peer, a) in bindings {
            b.insert(peer.trim().to_lowercase(), agent_id(a, &format!("bindings.{peer}"))?);
        }
        Ok(Policy { allow_from: allow, agent: agent_id(agent.unwrap_or("main"), "agent")?, bindings: b })
    }

    /// Whether a sender known by these ids (its user id, `@username`, …) may talk to the agent.
    pub fn allows(&self, ids: &[&str]) -> bool {
        self.allow_from.iter().any(|a| a == "*" || ids.iter().any(|id| id.to_lowercase() == *a))
    }

    /// The agent that answers in a conversation known by these ids (chat id, peer id, `@username`).
    pub fn agent_for(&self, ids: &[&str]) -> &AgentId {
        ids.iter().find_map(|id| self.bindings.get(&id.to_lowercase())).unwrap_or(&self.agent)
    }
}

/// The official Bot API.
pub const TELEGRAM_DEFAULT_API: &str = "https://api.telegram.org";
/// The variable the token is read from unless `bot_token_env` names another.
pub const TELEGRAM_TOKEN_ENV: &str = "TELEGRAM_BOT_TOKEN";
/// `[channels.telegram]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelegramSection {
    /// `false` turns the channel off (default: on when the section is there).
    pub enabled: Option<bool>,
    /// The environment variable holding the bot token (default `TELEGRAM_BOT_TOKEN`).
    pub bot_token_env: Option<String>,
    /// The Bot API server (default `https://api.telegram.org`; a self-hosted one otherwise).
    pub api_base_url: Option<String>,
    /// Telegram user ids or `@usernames` that may talk to the agent (`"*"`: anyone). Default: nobody.
    pub allow_from: Vec<String>,
    /// The agent that answers (default `main`).
    pub agent: Option<String>,
    /// A chat id, user id or `@username` → the agent that answers there.
    pub bindings: BTreeMap<String, String>,
    /// Seconds one `getUpdates` long poll waits (default 30).
    pub poll_timeout_secs: Option<u64>,
    /// In groups, answer only messages that mention the bot or reply to it (default true).
    pub require_mention: Option<bool>,
    /// Receive updates by webhook at this public URL (it must reach the gateway's
    /// `/api/channels/telegram/webhook`) instead of long polling.
    pub webhook_url: Option<String>,
    /// The variable holding the webhook's secret token (1–256 of `A-Z a-z 0-9 _ -`), required
    /// with `webhook_url`: Telegram sends it in `X-Telegram-Bot-Api-Secret-Token`.
    pub webhook_secret_env: Option<String>,
}

/// `[channels.telegram]`, validated.
#[derive(Clone)]
pub struct TelegramSettings {
    /// The bot token (a secret: redacted, never logged).
    pub token: String,
    /// Without a trailing slash.
    pub api_base_url: String,
    pub policy: Policy,
    pub poll_timeout: Duration,
    pub require_mention: bool,
    /// Webhook mode: the URL given to `setWebhook` and the secret token (a secret).
    pub webhook: Option<(String, String)>,
}

impl std::fmt::Debug for TelegramSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramSettings")
            .field("api_base_url", &self.api_base_url)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl TelegramSettings {
    /// Validates the section; `None` when it is disabled. Errors name the field.
    pub fn parse(s: &TelegramSection) -> Result<Option<TelegramSettings>, String> {
        const SECTION: &str = "[channels.telegram]";
        if s.enabled == Some(false) {
            return Ok(None);
        }
        let var = s.bot_token_env.as_deref().unwrap_or(TELEGRAM_TOKEN_ENV);
        let token =
            std::env::var(var).ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()).ok_or_else(|| {
                format!("{SECTION}: bot_token_env names {var}, which is not set (the bot token from @BotFather)")
            })?;
        if token.chars().any(|c| c.is_whitespace() || c == '/' || c == '?' || c == '#') {
            return Err(format!("{SECTION}: the token in {var} is not a bot token (it has spaces or URL characters)"));
        }
        let api = s.api_base_url.as_deref().unwrap_or(TELEGRAM_DEFAULT_API).trim_end_matches('/').to_owned();
        if !(api.starts_with("http://") || api.starts_with("https://")) {
            return Err(format!("{SECTION}: api_base_url {api:?} is not an http:// or https:// URL"));
        }
        let policy = Policy::parse(SECTION, &s.allow_from, s.agent.as_deref(), &s.bindings)?;
        let poll = s.poll_timeout_secs.unwrap_or(30);
        if poll > 600 {
            return Err(format!("{SECTION}: poll_timeout_secs {poll} is more than 600"));
        }
        let webhook = match (&s.webhook_url, &s.webhook_secret_env) {
            (None, None) => None,
            (Some(url), Some(var)) => {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(format!("{SECTION}: webhook_url {url:?} is not an https:// URL"));
                }
                let secret = std::env::var(var)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| format!("{SECTION}: webhook_secret_env names {var}, which is not set"))?;
                let ok =
                    secret.len() <= 256 && secret.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !ok {
                    return Err(format!(
                        "{SECTION}: the secret in {var} must be 1 to 256 of the characters A-Z a-z 0-9 _ -"
                    ));
                }
                Some((url.clone(), secret))
            }
            (Some(_), None) => return Err(format!("{SECTION}: webhook_url needs webhook_secret_env")),
            (None, Some(_)) => {
                return Err(format!("{SECTION}: webhook_secret_env is for webhook_url, which is not set"))
            }
        };
        Ok(Some(TelegramSettings {
            token,
            api_base_url: api,
            policy,
            poll_timeout: Duration::from_secs(poll),
            require_mention: s.require_mention.unwrap_or(true),
            webhook,
        }))
    }
}

/// The variable the access token is read from unless `access_token_env` names another.
pub const MATRIX_TOKEN_ENV: &str = "MATRIX_ACCESS_TOKEN";
/// `[channels.matrix]` as written in `pincer.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MatrixSection {
    /// `false` turns the channel off (default: on when the section is there).
    pub enabled: Option<bool>,
    /// `https://matrix.example.org` (the client-server API's base).
    pub homeserver_url: Option<String>,
    /// The bot's user id, `@bot:example.org`.
    pub user_id: Option<String>,
    /// The environment variable holding the bot's access token (default `MATRIX_ACCESS_TOKEN`).
    pub access_token_env: Option<String>,
    /// Matrix user ids (`@alice:example.org`) that may talk to the agent (`"*"`: anyone). Default: nobody.
    pub allow_from: Vec<String>,
    /// The agent that answers (default `main`).
    pub agent: Option<String>,
    /// A room id or user id → the agent that answers there.
    pub bindings: BTreeMap<String, String>,
    /// Seconds one `/sync` long poll waits (default 30).
    pub sync_timeout_secs: Option<u64>,
    /// In rooms, answer only messages that mention the bot or reply to it (default true).
    pub require_mention: Option<bool>,
}

/// `[channels.matrix]`, validated.
#[derive(Clone)]
pub struct MatrixSettings {
    /// The homeserver's base URL, without a trailing `/`.
    pub homeserver: String,
    pub user_id: String,
    /// The access token (a secret: never logged; the redactor knows it by value).
    pub token: String,
    pub policy: Policy,
    pub sync_timeout: Duration,
    /// In rooms, answer only messages addressed to the bot.
    pub require_mention: bool,
}

impl std::fmt::Debug for MatrixSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MatrixSettings")
            .field("homeserver", &self.homeserver)
            .field("user_id", &self.user_id)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Whether `s` is a Matrix user id: `@localpart:server`.
fn is_user_id(s: &str) -> bool {
    s.strip_prefix('@')
        .and_then(|r| r.split_once(':'))
        .is_some_and(|(local, server)| !local.is_empty() && !server.is_empty() && !s.chars().any(char::is_whitespace))
}

impl MatrixSettings {
    /// Validates the section (the token from the environment); `None` when it is disabled. Errors
    /// name the field.
    pub fn parse(s: &MatrixSection) -> Result<Option<MatrixSettings>, String> {
        Self::parse_with(s, |v| std::env::var(v).ok())
    }

    fn parse_with(s: &MatrixSection, env: impl Fn(&str) -> Option<String>) -> Result<Option<MatrixSettings>, String> {
        const SECTION: &str = "[channels.matrix]";
        if s.enabled == Some(false) {
            return Ok(None);
        }
        let url =
            s.homeserver_url.as_deref().map(str::trim).filter(|u| !u.is_empty()).ok_or_else(|| {
                format!("{SECTION}: homeserver_url is required (e.g. \"https://matrix.example.org\")")
            })?;
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.contains(char::is_whitespace) {
            return Err(format!("{SECTION}: homeserver_url {url:?} is not an http:// or https:// URL"));
        }
        let user_id = s.user_id.as_deref().unwrap_or_default().trim();
        if !is_user_id(user_id) {
            return Err(format!("{SECTION}: user_id {user_id:?} is not a Matrix user id like \"@bot:example.org\""));
        }
        let var = s.access_token_env.as_deref().map(str::trim).unwrap_or(MATRIX_TOKEN_ENV);
        let token = env(var).map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()).ok_or_else(|| {
            format!("{SECTION}: access_token_env names {var}, which is not set (the bot account's access token)")
        })?;
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("{SECTION}: the token in {var} is not an access token (it has spaces)"));
        }
        for u in &s.allow_from {
            if u.trim() != "*" && !is_user_id(u.trim()) {
                return Err(format!(
                    "{SECTION}: allow_from: {u:?} is not a Matrix user id like \"@alice:example.org\" (or \"*\")"
                ));
            }
        }
        let policy = Policy::parse(SECTION, &s.allow_from, s.agent.as_deref(), &s.bindings)?;
        let poll = s.sync_timeout_secs.unwrap_or(30);
        if poll > 600 {
            return Err(format!("{SECTION}: sync_timeout_secs {poll} is more than 600"));
        }
        Ok(Some(MatrixSettings {
            homeserver: url.trim_end_matches('/').to_owned(),
            user_id: user_id.to_owned(),
            token,
            policy,
            sync_timeout: Duration::from_secs(poll),
            require_mention: s.require_mention.unwrap_or(true),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_is_nobody_by_default_and_matches_ids_and_usernames() {
        let p = Policy::parse("[channels.x]", &[], None, &BTreeMap::new()).expect("policy");
        assert!(!p.allows(&["1", "@alice"]));
        let p = Policy::parse("[channels.x]", &["42".into(), "@Alice".into()], None, &BTreeMap::new()).expect("p");
        assert!(p.allows(&["7", "@alice"]) && p.allows(&["42"]) && !p.allows(&["7", "@bob"]));
        let any = Policy::parse("[channels.x]", &["*".into()], None, &BTreeMap::new()).expect("p");
        assert!(any.allows(&["9"]));
        let e = Policy::parse("[channels.x]", &[" ".into()], None, &BTreeMap::new()).expect_err("empty");
        assert!(e.contains("allow_from"), "{e}");
    }

    fn section(toml_text: &str) -> MatrixSection {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn matrix_settings_are_checked_and_name_the_field() {
        let env = |v: &str| (v == "MX_TOKEN").then(|| "syt_secret_token_value".to_owned());
        let parse = |t: &str| MatrixSettings::parse_with(&section(t), env);
        assert!(parse("enabled = false").unwrap().is_none(), "off when enabled = false");
        let ok = parse(
            "homeserver_url = \"https://m.example.org/\"\nuser_id = \"@bot:example.org\"\n\
             access_token_env = \"MX_TOKEN\"\nallow_from = [\"@alice:example.org\"]",
        )
        .unwrap()
        .unwrap();
        assert_eq!(ok.homeserver, "https://m.example.org");
        assert!(ok.policy.allows(&["@alice:example.org"]) && !ok.policy.allows(&["@bob:example.org"]));
        assert!(!format!("{ok:?}").contains("syt_secret"), "the token is not in Debug");
        let none = parse(
            "homeserver_url = \"https://m.example.org\"\nuser_id = \"@bot:example.org\"\naccess_token_env = \"MX_TOKEN\"",
        )
        .unwrap()
        .unwrap();
        assert!(!none.policy.allows(&["@alice:example.org"]), "nobody by default");
        for (bad, says) in [
            ("user_id = \"@b:x\"\naccess_token_env = \"MX_TOKEN\"", "homeserver_url is required"),
            ("homeserver_url = \"ftp://x\"\nuser_id = \"@b:x\"\naccess_token_env = \"MX_TOKEN\"", "not an http:// or https:// URL"),
            ("homeserver_url = \"http://x\"\nuser_id = \"bot\"\naccess_token_env = \"MX_TOKEN\"", "user_id \"bot\""),
            ("homeserver_url = \"http://x\"\nuser_id = \"@b:x\"", "MATRIX_ACCESS_TOKEN, which is not set"),
            ("homeserver_url = \"http://x\"\nuser_id = \"@b:x\"\naccess_token_env = \"NOPE\"", "NOPE, which is not set"),
            (
                "homeserver_url = \"http://x\"\nuser_id = \"@b:x\"\naccess_token_env = \"MX_TOKEN\"\nallow_from = [\"alice\"]",
                "allow_from: \"alice\"",
            ),
            ("homeserver_url = \"http://x\"\nuser_id = \"@b:x\"\naccess_token_env = \"MX_TOKEN\"\nsync_timeout_secs = 601", "sync_timeout_secs"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says) && e.contains("[channels.matrix]"), "{bad:?}: {e}");
        }
        assert!(toml::from_str::<MatrixSection>("homeserver = \"x\"").is_err(), "unknown fields are refused");
    }
}
