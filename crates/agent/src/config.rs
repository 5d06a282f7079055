//! Provider configuration (`[models.providers.<name>]` of `pincer.toml`, contract §3) and the
//! [`Providers`] registry that resolves `"provider/model"` strings into a [`ResolvedModel`].
//!
//! `"pincer/echo"` always resolves to the built-in offline echo model. API keys are read at
//! build time (`api_key`, else the variable named by `api_key_env`) and never printed: the
//! `Debug` impls redact them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

/// Wire format of a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
pub enum Api {
    /// OpenAI `POST /chat/completions` (also Ollama, vLLM, llama.cpp server, LM Studio).
    #[serde(rename = "openai-completions")]
    OpenaiCompletions,
    /// OpenAI `POST /responses`.
    #[serde(rename = "openai-responses")]
    OpenaiResponses,
    /// Anthropic `POST /v1/messages`.
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
    /// The built-in offline model; cannot be configured.
    #[serde(skip_deserializing)]
    PincerEcho,
}

impl Api {
    /// The name Pi writes into an assistant message's `api` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Api::OpenaiCompletions => "openai-completions",
            Api::OpenaiResponses => "openai-responses",
            Api::AnthropicMessages => "anthropic-messages",
            Api::PincerEcho => "pincer-echo",
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Prices in USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCost {
    /// Uncached input tokens.
    #[serde(default)]
    pub input: f64,
    /// Output tokens (reasoning included).
    #[serde(default)]
    pub output: f64,
    /// Input tokens read from the prompt cache.
    #[serde(default)]
    pub cache_read: f64,
    /// Input tokens written to the prompt cache.
    #[serde(default)]
    pub cache_write: f64,
}

/// One model of a provider.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The id sent to the provider (`model` field) and written into messages.
    pub id: String,
    /// Context window in tokens, if known.
    pub context_window: Option<u64>,
    /// Maximum output tokens sent with each request (Anthropic requires one: default 8192).
    pub max_tokens: Option<u64>,
    /// Prices; usage cost is zero when absent.
    pub cost: Option<ModelCost>,
    /// Whether the model reasons (thinking output is accepted either way).
    pub reasoning: Option<bool>,
}

impl ModelConfig {
    /// A model with only an id.
    pub fn named(id: impl Into<String>) -> Self {
        Self { id: id.into(), context_window: None, max_tokens: None, cost: None, reasoning: None }
    }
}

/// One `[models.providers.<name>]` table.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// Wire format.
    pub api: Api,
    /// Base URL, e.g. `https://api.openai.com/v1`, `http://127.0.0.1:11434/v1`, `https://api.anthropic.com`.
    pub base_url: String,
    /// The key itself (prefer `api_key_env`).
    pub api_key: Option<String>,
    /// Name of an environment variable holding the key.
    pub api_key_env: Option<String>,
    /// Extra HTTP headers sent with every request.
    pub headers: Option<BTreeMap<String, String>>,
    /// Known models. An empty list accepts any model id (no prices, no limits).
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Connect timeout in milliseconds (default 10 000).
    pub connect_timeout_ms: Option<u64>,
    /// Time allowed from sending the request to the first byte of the body (default 120 000).
    pub first_byte_timeout_ms: Option<u64>,
    /// Time allowed between two reads of the stream (default 120 000).
    pub idle_timeout_ms: Option<u64>,
    /// Retries after HTTP 429/5xx or a connect error, only before any output streamed (default 2).
    pub max_retries: Option<u32>,
    /// First backoff delay in milliseconds, doubled per retry (default 1 000); `retry-after` wins.
    pub retry_base_delay_ms: Option<u64>,
    /// Longest wait accepted before a retry, in milliseconds (default 60 000). A longer
    /// `retry-after` ends the run with a rate-limit error instead of waiting.
    pub retry_max_delay_ms: Option<u64>,
    /// A PEM file of extra CA certificates trusted for this provider's HTTPS, for a self-hosted
    /// server whose certificate comes from a private CA (or is self-signed). The system's roots
    /// stay trusted.
    pub ca_file: Option<std::path::PathBuf>,
}

impl ProviderConfig {
    /// A config with defaults for everything but the wire format and URL.
    pub fn new(api: Api, base_url: impl Into<String>) -> Self {
        Self {
            api,
            base_url: base_url.into(),
            api_key: None,
            api_key_env: None,
            headers: None,
            models: Vec::new(),
            connect_timeout_ms: None,
            first_byte_timeout_ms: None,
            idle_timeout_ms: None,
            max_retries: None,
            retry_base_delay_ms: None,
            retry_max_delay_ms: None,
            ca_file: None,
        }
    }
}

impl fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("api", &self.api)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("api_key_env", &self.api_key_env)
            .field("headers", &self.headers.as_ref().map(|h| h.keys().collect::<Vec<_>>()))
            .field("models", &self.models)
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

/// Timeouts of one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// TCP (and TLS) connect.
    pub connect: Duration,
    /// Request sent → response headers and first body bytes.
    pub first_byte: Duration,
    /// Between two reads of the body.
    pub idle: Duration,
}

/// Retry policy of one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// First backoff, doubled per retry.
    pub base_delay: Duration,
    /// Longest acceptable wait.
    pub max_delay: Duration,
}

/// Everything a request needs about a provider, shared by all its models.
pub struct ProviderRuntime {
    /// The configured name (`openai`, `local`, …; `pincer` for the echo model).
    pub name: String,
    /// Wire format.
    pub api: Api,
    /// Base URL without a trailing slash.
    pub base_url: String,
    pub(crate) api_key: Option<String>,
    pub(crate) headers: BTreeMap<String, String>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// Retries.
    pub retry: RetryPolicy,
    pub(crate) client: reqwest::Client,
    /// The last request URL and its parse (see [`ProviderRuntime::url`]).
    pub(crate) last_url: std::sync::Mutex<Option<(String, reqwest::Url)>>,
}

impl ProviderRuntime {
    /// `url` parsed, from a one-entry cache: a provider's requests go to one URL as a rule, and
    /// parsing it (IDNA mapping included) for each request cost more than the clone. `None` when
    /// it does not parse (the caller then lets the HTTP client report it).
    pub(crate) fn url(&self, url: &str) -> Option<reqwest::Url> {
        let mut last = self.last_url.lock().ok()?;
        if let Some((_, parsed)) = last.as_ref().filter(|(text, _)| text == url) {
            return Some(parsed.clone());
        }
        let parsed = reqwest::Url::parse(url).ok()?;
        *last = Some((url.to_owned(), parsed.clone()));
        Some(parsed)
    }
}

impl fmt::Debug for ProviderRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderRuntime")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeouts", &self.timeouts)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// A model ready to be called: its provider and its settings. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ResolvedModel {
    /// The provider.
    pub provider: Arc<ProviderRuntime>,
    /// The model.
    pub model: ModelConfig,
}

impl ResolvedModel {
    /// `"provider/model"`.
    pub fn spec(&self) -> String {
        format!("{}/{}", self.provider.name, self.model.id)
    }

    /// The built-in offline echo model (`pincer/echo`). Its provider (and HTTP client, whose TLS
    /// roots take a while to load) is made once per process.
    pub fn echo() -> Self {
        static ECHO: std::sync::OnceLock<Arc<ProviderRuntime>> = std::sync::OnceLock::new();
        let provider = ECHO.get_or_init(|| {
            Arc::new(ProviderRuntime {
                name: ECHO_PROVIDER.to_owned(),
                api: Api::PincerEcho,
                base_url: String::new(),
                api_key: None,
                headers: BTreeMap::new(),
                timeouts: Timeouts { connect: DEFAULT_CONNECT, first_byte: DEFAULT_FIRST_BYTE, idle: DEFAULT_IDLE },
                retry: RetryPolicy { max_retries: 0, base_delay: Duration::ZERO, max_delay: Duration::ZERO },
                client: crate::provider::default_client(),
                last_url: Default::default(),
            })
        });
        Self {
            provider: provider.clone(),
            model: ModelConfig {
                id: ECHO_MODEL.to_owned(),
                context_window: Some(128_000),
                max_tokens: Some(4096),
                cost: None,
                reasoning: Some(false),
            },
        }
    }
}

/// Provider name of the built-in model.
pub const ECHO_PROVIDER: &str = "pincer";
/// Model id of the built-in model.
pub const ECHO_MODEL: &str = "echo";
const DEFAULT_CONNECT: Duration = Duration::from_secs(10);
const DEFAULT_FIRST_BYTE: Duration = Duration::from_secs(120);
const DEFAULT_IDLE: Duration = Duration::from_secs(120);

/// A configuration or resolution error; the message names the provider or string at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `models.providers.pincer` would shadow the built-in model.
    #[error("provider name \"pincer\" is reserved for the built-in offline model pincer/echo; rename [models.providers.pincer]")]
    ReservedName,
    /// A provider's base URL does not parse.
    #[error("provider {provider}: base_url {url:?} is not an http(s) URL")]
    BadBaseUrl {
        /// Provider name.
        provider: String,
        /// The URL as configured.
        url: String,
    },
    /// `api_key_env` names a variable that is not set.
    #[error("provider {provider}: api_key_env names {var}, which is not set in the environment")]
    MissingKeyEnv {
        /// Provider name.
        provider: String,
        /// The variable.
        var: String,
    },
    /// The HTTP client could not be built.
    #[error("provider {provider}: cannot build HTTP client: {message}")]
    Client {
        /// Provider name.
        provider: String,
        /// reqwest's reason.
        message: String,
    },
    /// A model string without `/`.
    #[error("model {spec:?} is not of the form \"provider/model\"; configured: {configured}")]
    BadSpec {
        /// The string as given.
        spec: String,
        /// What is configured.
        configured: String,
    },
    /// Unknown provider.
    #[error("model {spec:?}: no provider {provider:?} is configured; configured: {configured}")]
    UnknownProvider {
        /// The string as given.
        spec: String,
        /// The provider part.
        provider: String,
        /// What is configured.
        configured: String,
    },
    /// Unknown model of a known provider.
    #[error("model {spec:?}: provider {provider:?} has no model {model:?}; its models: {models}")]
    UnknownModel {
        /// The string as given.
        spec: String,
        /// The provider part.
        provider: String,
        /// The model part.
        model: String,
        /// The provider's models.
        models: String,
    },
}

/// The configured providers, plus the built-in `pincer/echo`.
#[derive(Debug, Default)]
pub struct Providers {
    providers: BTreeMap<String, (Arc<ProviderRuntime>, Vec<ModelConfig>)>,
}

impl Providers {
    /// Builds the registry: validates URLs, reads keys, builds one HTTP client per provider.
    pub fn new(configs: BTreeMap<String, ProviderConfig>) -> Result<Self, ConfigError> {
        let mut providers = BTreeMap::new();
        for (name, cfg) in configs {
            if name == ECHO_PROVIDER {
                return Err(ConfigError::ReservedName);
            }
            let base_url = cfg.base_url.trim_end_matches('/').to_owned();
            match reqwest::Url::parse(&base_url) {
                Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                _ => return Err(ConfigError::BadBaseUrl { provider: name, url: cfg.base_url }),
            }
            let api_key = match (&cfg.api_key, &cfg.api_key_env) {
                (Some(k), _) => Some(k.clone()),
                (None, Some(var)) => match std::env::var(var) {
                    Ok(v) if !v.is_empty() => Some(v),
                    _ => return Err(ConfigError::MissingKeyEnv { provider: name, var: var.clone() }),
                },
                (None, None) => None,
            };
            let timeouts = Timeouts {
                connect: cfg.connect_timeout_ms.map_or(DEFAULT_CONNECT, Duration::from_millis),
                first_byte: cfg.first_byte_timeout_ms.map_or(DEFAULT_FIRST_BYTE, Duration::from_millis),
                idle: cfg.idle_timeout_ms.map_or(DEFAULT_IDLE, Duration::from_millis),
            };
            let retry = RetryPolicy {
                max_retries: cfg.max_retries.unwrap_or(2),
                base_delay: Duration::from_millis(cfg.retry_base_delay_ms.unwrap_or(1000)),
                max_delay: Duration::from_millis(cfg.retry_max_delay_ms.unwrap_or(60_000)),
            };
            let client = crate::provider::http_client(timeouts.connect, cfg.ca_file.as_deref())
                .map_err(|message| ConfigError::Client { provider: name.clone(), message })?;
            let runtime = ProviderRuntime {
                name: name.clone(),
                api: cfg.api,
                base_url,
                api_key,
                headers: cfg.headers.unwrap_or_default(),
                timeouts,
                retry,
                client,
                last_url: Default::default(),
            };
            providers.insert(name, (Arc::new(runtime), cfg.models));
        }
        Ok(Self { providers })
    }

    /// The secrets the providers were configured with: each API key (from `api_key` or the
    /// variable named by `api_key_env`) and the values of headers that carry credentials
    /// (`authorization`, or a name containing `key`, `token` or `secret`). For redaction only;
    /// never log them.
    pub fn secret_values(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (p, _) in self.providers.values() {
            out.extend(p.api_key.iter().cloned());
            for (name, value) in &p.headers {
                let n = name.to_ascii_lowercase();
                if n == "authorization" || ["key", "token", "secret"].iter().any(|w| n.contains(w)) {
                    out.push(value.strip_prefix("Bearer ").unwrap_or(value).to_owned());
                }
            }
        }
        out
    }

    /// Each configured provider as `pincer doctor` shows it: name, wire format, base URL and
    /// whether it has a key (configured, or from `api_key_env`).
    pub fn summaries(&self) -> Vec<(String, Api, String, bool)> {
        self.providers.values().map(|(p, _)| (p.name.clone(), p.api, p.base_url.clone(), p.api_key.is_some())).collect()
    }

    /// Asks provider `name` for its model list (`GET <base_url>/models`; Anthropic's
    /// `/v1/models`) with its key and headers, within `timeout`: the HTTP status it answered,
    /// or why no answer came (the error chain).
    pub async fn probe(&self, name: &str, timeout: Duration) -> Result<u16, String> {
        let Some((p, _)) = self.providers.get(name) else { return Err(format!("no provider {name:?}")) };
        let (path, key_header) = match p.api {
            Api::AnthropicMessages => ("/v1/models", "x-api-key"),
            _ => ("/models", "authorization"),
        };
        let mut req = p.client.get(format!("{}{path}", p.base_url)).timeout(timeout);
        if p.api == Api::AnthropicMessages {
            req = req.header("anthropic-version", crate::provider::anthropic::VERSION);
        }
        if let Some(key) = &p.api_key {
            let value = if key_header == "authorization" { format!("Bearer {key}") } else { key.clone() };
            req = req.header(key_header, value);
        }
        for (k, v) in &p.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        match req.send().await {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) => Err(crate::provider::error_chain(&e)),
        }
    }

    /// Names of the configured providers (without the built-in one).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.providers.keys().map(String::as_str)
    }

    /// True when no provider is configured (only `pincer/echo` is available).
    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// Every `"provider/model"` that resolves, the built-in one first.
    pub fn configured(&self) -> Vec<String> {
        let mut out = vec![format!("{ECHO_PROVIDER}/{ECHO_MODEL}")];
        for (name, (_, models)) in &self.providers {
            if models.is_empty() {
                out.push(format!("{name}/<any model>"));
            }
            out.extend(models.iter().map(|m| format!("{name}/{}", m.id)));
        }
        out
    }

    /// Resolves `"provider/model"`. The model part may itself contain `/` (`local/qwen/qwen3`).
    pub fn resolve(&self, spec: &str) -> Result<ResolvedModel, ConfigError> {
        let configured = || self.configured().join(", ");
        let Some((provider, model)) = spec.split_once('/').filter(|(p, m)| !p.is_empty() && !m.is_empty()) else {
            return Err(ConfigError::BadSpec { spec: spec.to_owned(), configured: configured() });
        };
        if provider == ECHO_PROVIDER && model == ECHO_MODEL {
            return Ok(ResolvedModel::echo());
        }
        let Some((runtime, models)) = self.providers.get(provider) else {
            return Err(ConfigError::UnknownProvider {
                spec: spec.to_owned(),
                provider: provider.to_owned(),
                configured: configured(),
            });
        };
        let model_cfg = if models.is_empty() {
            ModelConfig::named(model)
        } else {
            match models.iter().find(|m| m.id == model) {
                Some(m) => m.clone(),
                None => {
                    return Err(ConfigError::UnknownModel {
                        spec: spec.to_owned(),
                        provider: provider.to_owned(),
                        model: model.to_owned(),
                        models: models.iter().map(|m| m.id.as_str()).collect::<Vec<_>>().join(", "),
                    })
                }
            }
        };
        Ok(ResolvedModel { provider: runtime.clone(), model: model_cfg })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use pretty_assertions::assert_eq;

    const TOML: &str = r#"
[models.providers.local]
api = "openai-completions"
base_url = "http://127.0.0.1:11434/v1/"
api_key = "sk-secret-value"
idle_timeout_ms = 5000
[[models.providers.local.models]]
id = "llama3.2"
context_window = 128000
max_tokens = 8192
cost = { input = 3.0, output = 15.0, cache_read = 0.3, cache_write = 3.75 }

[models.providers.claude]
api = "anthropic-messages"
base_url = "https://api.anthropic.com"
headers = { "anthropic-beta" = "x" }
[[models.providers.claude.models]]
id = "claude-sonnet-4-5"
"#;

    #[test]
    fn request_urls_are_parsed_once_and_follow_a_change() {
        let echo = ResolvedModel::echo();
        let p = &echo.provider;
        let a = p.url("http://127.0.0.1:11434/v1/chat/completions").expect("parses");
        assert_eq!(a.as_str(), "http://127.0.0.1:11434/v1/chat/completions");
        assert_eq!(p.url("http://127.0.0.1:11434/v1/chat/completions"), Some(a));
        let b = p.url("http://localhost:8080/v1/responses").expect("another URL");
        assert_eq!(b.as_str(), "http://localhost:8080/v1/responses");
        assert_eq!(p.url("not a url"), None);
        assert_eq!(p.url("http://localhost:8080/v1/responses"), Some(b), "the last good one stays");
    }

    #[derive(Deserialize)]
    struct Root {
        models: Models,
    }
    #[derive(Deserialize)]
    struct Models {
        providers: BTreeMap<String, ProviderConfig>,
    }

    fn providers() -> Providers {
        let root: Root = toml::from_str(TOML).unwrap();
        Providers::new(root.models.providers).unwrap()
    }

    #[test]
    fn parses_toml_and_resolves() {
        let p = providers();
        let m = p.resolve("local/llama3.2").unwrap();
        assert_eq!(m.spec(), "local/llama3.2");
        assert_eq!(m.provider.base_url, "http://127.0.0.1:11434/v1");
        assert_eq!(m.provider.api, Api::OpenaiCompletions);
        assert_eq!(
            m.provider.timeouts,
            Timeouts {
                connect: Duration::from_secs(10),
                first_byte: Duration::from_secs(120),
                idle: Duration::from_millis(5000)
            }
        );
        assert_eq!(
            m.provider.retry,
            RetryPolicy { max_retries: 2, base_delay: Duration::from_secs(1), max_delay: Duration::from_secs(60) }
        );
        assert_eq!(
            m.model,
            ModelConfig {
                id: "llama3.2".into(),
                context_window: Some(128000),
                max_tokens: Some(8192),
                cost: Some(ModelCost { input: 3.0, output: 15.0, cache_read: 0.3, cache_write: 3.75 }),
                reasoning: None,
            }
        );
    }

    #[test]
    fn echo_always_resolves() {
        let m = Providers::default().resolve("pincer/echo").unwrap();
        assert_eq!((m.provider.api, m.spec()), (Api::PincerEcho, "pincer/echo".to_owned()));
        // One provider (and HTTP client) for every turn, not a new one per resolve.
        assert!(Arc::ptr_eq(&m.provider, &ResolvedModel::echo().provider));
    }

    #[test]
    fn unknown_names_say_what_is_configured() {
        let p = providers();
        assert_eq!(
            p.resolve("openai/gpt-4o").unwrap_err().to_string(),
            "model \"openai/gpt-4o\": no provider \"openai\" is configured; configured: pincer/echo, claude/claude-sonnet-4-5, local/llama3.2"
        );
        assert_eq!(
            p.resolve("local/llama9").unwrap_err().to_string(),
            "model \"local/llama9\": provider \"local\" has no model \"llama9\"; its models: llama3.2"
        );
        assert_eq!(
            p.resolve("gpt-4o").unwrap_err().to_string(),
            "model \"gpt-4o\" is not of the form \"provider/model\"; configured: pincer/echo, claude/claude-sonnet-4-5, local/llama3.2"
        );
    }

    #[test]
    fn debug_never_shows_the_key() {
        let root: Root = toml::from_str(TOML).unwrap();
        let cfg = format!("{:?}", root.models.providers);
        let runtime = format!("{:?}", providers().resolve("local/llama3.2").unwrap());
        assert!(!cfg.contains("sk-secret-value") && cfg.contains("<redacted>"), "{cfg}");
        assert!(!runtime.contains("sk-secret-value") && runtime.contains("<redacted>"), "{runtime}");
    }

    #[test]
    fn bad_config_is_refused_with_the_provider_named() {
        let mut m = BTreeMap::new();
        m.insert("x".to_owned(), ProviderConfig::new(Api::OpenaiCompletions, "localhost:11434"));
        assert_eq!(
            Providers::new(m).unwrap_err().to_string(),
            "provider x: base_url \"localhost:11434\" is not an http(s) URL"
        );
        let mut m = BTreeMap::new();
        let mut cfg = ProviderConfig::new(Api::OpenaiCompletions, "http://localhost:1");
        cfg.api_key_env = Some("PINCER_TEST_SURELY_UNSET_VAR".into());
        m.insert("y".to_owned(), cfg);
        assert_eq!(
            Providers::new(m).unwrap_err().to_string(),
            "provider y: api_key_env names PINCER_TEST_SURELY_UNSET_VAR, which is not set in the environment"
        );
        let err = toml::from_str::<ProviderConfig>("api = \"pincer-echo\"\nbase_url = \"http://x\"").unwrap_err();
        assert!(err.to_string().contains("unknown variant"), "{err}");
    }

    #[test]
    fn empty_model_list_accepts_any_model() {
        let mut m = BTreeMap::new();
        m.insert("openai".to_owned(), ProviderConfig::new(Api::OpenaiResponses, "https://api.openai.com/v1"));
        let p = Providers::new(m).unwrap();
        assert_eq!(p.resolve("openai/gpt-5").unwrap().model, ModelConfig::named("gpt-5"));
    }
}
