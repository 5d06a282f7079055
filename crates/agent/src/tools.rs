//! Tools the model may call: the [`Tool`] trait, a [`ToolRegistry`] with a JSON schema per tool
//! (arguments are checked against the schema's `required` and top-level `type`s before the
//! call), the built-ins and the [`ToolPolicy`] choosing among them.
//!
//! Built-ins: Pi's file tools `read`, `write`, `edit`, `ls` ([`files`]), `find`, `grep`
//! ([`search`]), all confined to the agent's [`Workspace`] ([`workspace`]), Pi's `bash` in a
//! sandbox over that workspace ([`bash`]), `web_fetch` ([`web_fetch`]: an HTTP GET made readable,
//! the private network refused) and `current_time`.
//! A failing tool is not a failed run: its error becomes a `toolResult` with `isError: true`.
//! A tool may report partial results while it runs ([`ToolUpdates`], Pi's `onUpdate`): they are
//! live only, never written to the transcript.

pub mod bash;
pub mod files;
mod html;
pub mod search;
pub mod truncate;
pub mod web_fetch;
pub mod workspace;

pub use workspace::Workspace;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::provider::ToolSpec;

/// What a tool returns: Pi content blocks (`text` / `image`) and optional `details`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// Content blocks shown to the model.
    pub content: Vec<Value>,
    /// Extra data kept in the transcript, not sent to the model.
    pub details: Option<Value>,
}

impl ToolOutput {
    /// A single text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self { content: vec![json!({"type": "text", "text": text.into()})], details: None }
    }
}

/// Why a tool call failed. Its text becomes the error tool result the model reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The model named a tool that is not registered.
    #[error("Tool {name} not found. Available tools: {}", available.join(", "))]
    NotFound { name: String, available: Vec<String> },
    /// The arguments do not fit the tool's schema.
    #[error("Invalid arguments for {tool}: {reason}")]
    InvalidArguments { tool: String, reason: String },
    /// The tool ran and failed (a refused path, a missing file, …).
    #[error("{0}")]
    Failed(String),
}

impl ToolError {
    /// A failure of the tool itself.
    pub fn failed(message: impl Into<String>) -> ToolError {
        ToolError::Failed(message.into())
    }
}

impl ToolOutput {
    /// Pi's tool result object: `{content, details?}`.
    pub fn to_value(&self) -> Value {
        let mut v = json!({"content": self.content});
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

/// Where a running tool reports its partial result (Pi's `onUpdate`). Reporting never waits and
/// never queues: a newer partial replaces one not yet taken, so a slow reader costs one partial of
/// memory at most. [`ToolUpdates::none`] (the default) discards them.
#[derive(Clone, Default)]
pub struct ToolUpdates(Option<Arc<tokio::sync::watch::Sender<Option<ToolOutput>>>>);

impl ToolUpdates {
    /// Updates nobody reads.
    pub fn none() -> ToolUpdates {
        ToolUpdates(None)
    }

    /// Updates read from the returned receiver (the latest partial, `None` before the first).
    pub fn channel() -> (ToolUpdates, tokio::sync::watch::Receiver<Option<ToolOutput>>) {
        let (tx, rx) = tokio::sync::watch::channel(None);
        (ToolUpdates(Some(Arc::new(tx))), rx)
    }

    /// Whether someone reads the updates (a tool may skip building partials otherwise).
    pub fn wanted(&self) -> bool {
        self.0.as_ref().is_some_and(|tx| !tx.is_closed())
    }

    /// Reports the partial result so far, replacing any not yet taken.
    pub fn report(&self, partial: ToolOutput) {
        if let Some(tx) = &self.0 {
            tx.send_replace(Some(partial));
        }
    }
}

tokio::task_local! {
    /// The id of the tool call being run (set by the run loop around each call): a key that stays
    /// the same for the call across a crash and its resume, which a tool with effects outside the
    /// workspace can dedupe on. `bash` hands it to the command as `PINCER_TOOL_CALL_ID`.
    pub static CALL_ID: Arc<str>;
}

/// The id of the call being run, when the run loop set one ([`CALL_ID`]).
pub fn current_call_id() -> Option<Arc<str>> {
    CALL_ID.try_with(Arc::clone).ok()
}

/// Future returned by [`Tool::call`].
pub type ToolFuture<'a> = Pin<Box<dyn Future<Output = Result<ToolOutput, ToolError>> + Send + 'a>>;

/// A tool. `call` is dropped when the run is aborted, so it must not leave half-done work.
pub trait Tool: Send + Sync {
    /// Name the model uses.
    fn name(&self) -> &str;
    /// What it does, for the model.
    fn description(&self) -> &str;
    /// JSON schema of the arguments object.
    fn parameters(&self) -> Value;
    /// Mends arguments models commonly get wrong before they are checked against the schema (Pi's
    /// `prepareArguments`); the transcript keeps them as the model sent them.
    fn prepare(&self, arguments: Value) -> Value {
        arguments
    }
    /// Runs the tool; `Err` becomes an error tool result.
    fn call(&self, arguments: Value) -> ToolFuture<'_>;
    /// True when running a call again changes nothing outside it (it only reads). A call cut by a
    /// crash is run again when its turn resumes only if its tool says so; any other gets an
    /// interrupted error result instead ([`ToolRegistry::is_read_only`]).
    fn read_only(&self) -> bool {
        false
    }
    /// True when a call may change or destroy something outside the run (an MCP tool the server
    /// does not say is read-only or harmless): the approval policy asks before it runs unless the
    /// config says otherwise (`crates/engine/src/approvals.rs`). The built-ins asked about by
    /// default are listed there by name.
    fn destructive(&self) -> bool {
        false
    }
    /// Runs the tool, reporting partial results to `updates` as it goes. The default reports
    /// none and is [`Tool::call`]; a tool with output worth watching (`bash`) overrides it.
    fn call_with_updates(&self, arguments: Value, updates: ToolUpdates) -> ToolFuture<'_> {
        drop(updates);
        self.call(arguments)
    }
}

/// The tools of a run, by name.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
    /// What [`ToolRegistry::specs`] hands out, built when a tool is registered (not per run).
    specs: Arc<[ToolSpec]>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// No tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every built-in tool ([`BUILTIN_TOOLS`]) but `bash` and `web_fetch` (which need their settings:
    /// see [`ToolRegistry::from_policy`]), over the workspace at `workspace`.
    pub fn with_builtins(workspace: impl Into<PathBuf>) -> Self {
        let ws = Workspace::new(workspace);
        let mut r = Self::new();
        for name in BUILTIN_TOOLS {
            if let Some(tool) = builtin(name, &ws, None, None) {
                r.register(tool);
            }
        }
        r
    }

    /// The tools `policy` allows, over `workspace`; `bash` and `web_fetch` with their settings.
    pub fn from_policy(
        policy: &ToolPolicy,
        workspace: impl Into<PathBuf>,
        bash: &Arc<bash::BashConfig>,
        web_fetch: &Arc<web_fetch::WebFetchConfig>,
    ) -> Self {
        let ws = Workspace::new(workspace);
        let mut r = Self::new();
        for name in &policy.tools {
            if let Some(tool) = builtin(name, &ws, Some(bash), Some(web_fetch)) {
                r.register(tool);
            }
        }
        r
    }

    /// The names of the tools, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// Adds (or replaces) a tool.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.name().to_owned(), tool);
        self.specs = self.tools.values().map(|t| ToolSpec::new(t.name(), t.description(), t.parameters())).collect();
    }

    /// These tools and `extra` (replacing any of the same name), the specs built once.
    pub fn with_tools(&self, extra: impl IntoIterator<Item = Arc<dyn Tool>>) -> ToolRegistry {
        let mut tools = self.tools.clone();
        for tool in extra {
            tools.insert(tool.name().to_owned(), tool);
        }
        let specs = tools.values().map(|t| ToolSpec::new(t.name(), t.description(), t.parameters())).collect();
        ToolRegistry { tools, specs }
    }

    /// These tools, each replaced by what `wrap` makes of it (same names; the specs are shared, not
    /// built again): how a caller puts its own checks around the calls of one run.
    pub fn wrapped(&self, wrap: impl Fn(&Arc<dyn Tool>) -> Arc<dyn Tool>) -> ToolRegistry {
        let tools = self.tools.iter().map(|(name, tool)| (name.clone(), wrap(tool))).collect();
        ToolRegistry { tools, specs: self.specs.clone() }
    }

    /// Whether `name` is a registered tool that only reads ([`Tool::read_only`]).
    pub fn is_read_only(&self, name: &str) -> bool {
        self.tools.get(name).is_some_and(|t| t.read_only())
    }

    /// True when there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The tools as offered to the model, sorted by name.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        self.specs.clone()
    }

    /// Validates the arguments and runs the tool. Every failure is an `Err` with a message for
    /// the model (unknown tool, invalid arguments, the tool's own error).
    pub async fn execute(&self, name: &str, arguments: Value) -> Result<ToolOutput, ToolError> {
        self.execute_with_updates(name, arguments, ToolUpdates::none()).await
    }

    /// [`ToolRegistry::execute`], the tool reporting its partial results to `updates`.
    pub async fn execute_with_updates(
        &self,
        name: &str,
        arguments: Value,
        updates: ToolUpdates,
    ) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.tools.get(name) else {
            let available = self.tools.keys().cloned().collect();
            return Err(ToolError::NotFound { name: name.to_owned(), available });
        };
        let arguments = tool.prepare(arguments);
        validate(&tool.parameters(), &arguments)
            .map_err(|reason| ToolError::InvalidArguments { tool: name.to_owned(), reason })?;
        tool.call_with_updates(arguments, updates).await
    }
}

/// Every built-in tool's name.
pub const BUILTIN_TOOLS: &[&str] =
    &["read", "write", "edit", "bash", "ls", "find", "grep", "web_fetch", "current_time"];

/// The built-in tool `name` over `ws` (`bash` and `web_fetch` only given their settings).
fn builtin(
    name: &str,
    ws: &Arc<Workspace>,
    bash: Option<&Arc<bash::BashConfig>>,
    web: Option<&Arc<web_fetch::WebFetchConfig>>,
) -> Option<Arc<dyn Tool>> {
    let ws = ws.clone();
    Some(match name {
        "bash" => Arc::new(bash::BashTool { workspace: ws, config: bash?.clone() }),
        "web_fetch" => Arc::new(web_fetch::WebFetchTool::new(web?.clone())),
        "read" => Arc::new(files::ReadTool(ws)),
        "write" => Arc::new(files::WriteTool(ws)),
        "edit" => Arc::new(files::EditTool(ws)),
        "ls" => Arc::new(files::LsTool(ws)),
        "find" => Arc::new(search::FindTool(ws)),
        "grep" => Arc::new(search::GrepTool(ws)),
        "current_time" => Arc::new(CurrentTimeTool),
        _ => return None,
    })
}

/// Which built-ins an agent gets: a profile's tools, plus `allow`, minus `deny`
/// (`[agents.defaults.tools]`). Profiles: `minimal` = the read-only tools (`read`, `ls`, `find`,
/// `grep`), `coding` (the default) = Pi's coding tools (those and `write`, `edit`, `bash`), `full` =
/// every built-in (Pi's seven, `web_fetch` and `current_time`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    /// The profile the list started from.
    pub profile: String,
    /// The effective tools, in [`BUILTIN_TOOLS`] order.
    pub tools: Vec<String>,
}

impl ToolPolicy {
    /// The profiles' names.
    pub const PROFILES: &'static [&'static str] = &["minimal", "coding", "full"];

    /// The tools of `profile` (default `coding`) with `allow` added and `deny` removed. A profile or
    /// tool name that does not exist is an error naming it (a tool the config names but Pincer
    /// cannot provide must stop the startup, not vanish silently).
    pub fn new(profile: Option<&str>, allow: &[String], deny: &[String]) -> Result<ToolPolicy, String> {
        let profile = profile.unwrap_or("coding");
        let base: &[&str] = match profile {
            "minimal" => &["read", "ls", "find", "grep"],
            "coding" => &["read", "write", "edit", "bash", "ls", "find", "grep"],
            "full" => BUILTIN_TOOLS,
            other => return Err(format!("unknown tool profile {other:?} (profiles: {})", Self::PROFILES.join(", "))),
        };
        for name in allow.iter().chain(deny) {
            if !BUILTIN_TOOLS.contains(&name.as_str()) {
                return Err(format!("unknown tool {name:?} (tools: {})", BUILTIN_TOOLS.join(", ")));
            }
        }
        let tools = BUILTIN_TOOLS
            .iter()
            .filter(|t| (base.contains(t) || allow.iter().any(|a| a == *t)) && !deny.iter().any(|d| d == *t))
            .map(|t| (*t).to_owned())
            .collect();
        Ok(ToolPolicy { profile: profile.to_owned(), tools })
    }
}

/// Checks `required` properties and the `type` of each present top-level property.
pub fn validate(schema: &Value, args: &Value) -> Result<(), String> {
    let Some(obj) = args.as_object() else {
        return Err("arguments must be a JSON object".to_owned());
    };
    for req in schema.get("required").and_then(Value::as_array).map_or(&[][..], Vec::as_slice) {
        if let Some(k) = req.as_str() {
            if !obj.contains_key(k) {
                return Err(format!("missing required property {k:?}"));
            }
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    for (k, v) in obj {
        let Some(expected) = props.and_then(|p| p.get(k)).and_then(|p| p.get("type")).and_then(Value::as_str) else {
            continue;
        };
        let ok = match expected {
            "string" => v.is_string(),
            "integer" => v.is_i64() || v.is_u64(),
            "number" => v.is_number(),
            "boolean" => v.is_boolean(),
            "object" => v.is_object(),
            "array" => v.is_array(),
            "null" => v.is_null(),
            _ => true,
        };
        if !ok {
            return Err(format!("property {k:?} must be of type {expected}, got {v}"));
        }
    }
    Ok(())
}

/// `current_time`: the current UTC date and time.
#[derive(Debug, Clone, Copy, Default)]
pub struct CurrentTimeTool;

impl Tool for CurrentTimeTool {
    fn name(&self) -> &str {
        "current_time"
    }
    fn description(&self) -> &str {
        "Returns the current date and time in UTC (ISO 8601) and as Unix milliseconds."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }
    fn read_only(&self) -> bool {
        true
    }
    fn call(&self, _arguments: Value) -> ToolFuture<'_> {
        let now = chrono::Utc::now();
        let out = ToolOutput {
            content: vec![json!({"type": "text", "text": now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)})],
            details: Some(json!({"unixMs": now.timestamp_millis()})),
        };
        Box::pin(std::future::ready(Ok(out)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use pretty_assertions::assert_eq;

    fn workspace() -> (tempfile::TempDir, tempfile::TempDir) {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "top secret").unwrap();
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("sub")).unwrap();
        std::fs::write(ws.path().join("sub/notes.txt"), "hello notes").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), ws.path().join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws.path().join("outdir")).unwrap();
        std::os::unix::fs::symlink(ws.path().join("sub/notes.txt"), ws.path().join("inner-link")).unwrap();
        (ws, outside)
    }

    #[tokio::test]
    async fn file_tools_stay_inside_the_workspace() {
        let (ws, outside) = workspace();
        let reg = ToolRegistry::with_builtins(ws.path());
        let read = |p: &str| {
            let call = reg.execute("read", json!({"path": p}));
            async move { call.await.map_err(|e| e.to_string()) }
        };
        assert_eq!(read("sub/notes.txt").await, Ok(ToolOutput::text("hello notes")));
        assert_eq!(read("sub/../inner-link").await, Ok(ToolOutput::text("hello notes")));
        assert_eq!(read("escape").await, Err("escape: refused, it resolves outside the workspace".to_owned()));
        assert_eq!(
            read("outdir/secret.txt").await,
            Err("outdir/secret.txt: refused, it resolves outside the workspace".to_owned())
        );
        let dotdot = format!("../{}/secret.txt", outside.path().file_name().unwrap().to_str().unwrap());
        assert_eq!(read(&dotdot).await, Err(format!("{dotdot}: refused, it resolves outside the workspace")));
        let abs = outside.path().join("secret.txt").display().to_string();
        assert_eq!(
            read(&abs).await,
            Err(format!("{abs}: absolute paths are refused; give a path relative to the workspace"))
        );
        assert_eq!(read("sub").await, Err("sub: Is a directory (os error 21)".to_owned()));
        let write = |p: &str| {
            let call = reg.execute("write", json!({"path": p, "content": "x"}));
            async move { call.await.map_err(|e| e.to_string()) }
        };
        assert_eq!(write("escape").await, Err("escape: refused, it resolves outside the workspace".to_owned()));
        assert_eq!(
            write("outdir/new.txt").await,
            Err("outdir/new.txt: refused, it resolves outside the workspace".to_owned())
        );
        assert_eq!(write(&dotdot).await, Err(format!("{dotdot}: refused, it resolves outside the workspace")));
        assert_eq!(write("a/../../b").await, Err("a/../../b: refused, it resolves outside the workspace".to_owned()));
        assert_eq!(std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(), "top secret");
        assert!(!outside.path().join("new.txt").exists());
        assert_eq!(write("new/dir/f.txt").await, Ok(ToolOutput::text("Successfully wrote 1 bytes to new/dir/f.txt")));
        assert_eq!(std::fs::read_to_string(ws.path().join("new/dir/f.txt")).unwrap(), "x");
        assert_eq!(read("missing").await, Err("missing: No such file or directory (os error 2)".to_owned()));
    }

    #[test]
    fn web_fetch_is_in_the_full_profile_only_or_when_allowed() {
        let tools = |profile: Option<&str>, allow: &[&str]| {
            let allow: Vec<String> = allow.iter().map(|s| (*s).to_owned()).collect();
            ToolPolicy::new(profile, &allow, &[]).unwrap().tools
        };
        assert_eq!(
            tools(Some("full"), &[]),
            ["read", "write", "edit", "bash", "ls", "find", "grep", "web_fetch", "current_time"]
        );
        assert_eq!(tools(None, &[]), ["read", "write", "edit", "bash", "ls", "find", "grep"]);
        assert_eq!(
            tools(Some("coding"), &["web_fetch"]),
            ["read", "write", "edit", "bash", "ls", "find", "grep", "web_fetch"]
        );
        assert_eq!(tools(Some("minimal"), &["web_fetch"]), ["read", "ls", "find", "grep", "web_fetch"]);
        // The registry built from the policy offers it, with its settings.
        let policy = ToolPolicy::new(Some("minimal"), &["web_fetch".to_owned()], &[]).unwrap();
        let bash = Arc::new(bash::BashConfig {
            sandbox: bash::Sandbox::Off,
            network: false,
            default_timeout: bash::DEFAULT_TIMEOUT,
            hidden: Vec::new(),
            output_dir: PathBuf::from("/nonexistent"),
        });
        let reg = ToolRegistry::from_policy(&policy, "/nonexistent", &bash, &Arc::default());
        assert_eq!(reg.names(), ["find", "grep", "ls", "read", "web_fetch"]);
    }

    #[tokio::test]
    async fn registry_validates_arguments_and_names() {
        let reg = ToolRegistry::with_builtins("/nonexistent");
        let missing = reg.execute("read", json!({})).await.unwrap_err();
        assert_eq!(
            missing,
            ToolError::InvalidArguments { tool: "read".into(), reason: "missing required property \"path\"".into() }
        );
        assert_eq!(missing.to_string(), "Invalid arguments for read: missing required property \"path\"");
        assert_eq!(
            reg.execute("read", json!({"path": 3})).await.map_err(|e| e.to_string()),
            Err("Invalid arguments for read: property \"path\" must be of type string, got 3".to_owned())
        );
        let unknown = reg.execute("rm_rf", json!({})).await.unwrap_err();
        assert!(matches!(&unknown, ToolError::NotFound { name, .. } if name == "rm_rf"), "{unknown:?}");
        assert_eq!(
            unknown.to_string(),
            "Tool rm_rf not found. Available tools: current_time, edit, find, grep, ls, read, write"
        );
        let t = reg.execute("current_time", json!({})).await.unwrap();
        let text = t.content[0]["text"].as_str().unwrap();
        assert_eq!(
            chrono::DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis(),
            t.details.unwrap()["unixMs"]
        );
    }
}
