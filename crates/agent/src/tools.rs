//! Tools the model may call: the [`Tool`] trait, a [`ToolRegistry`] with a JSON schema per tool
//! (arguments are checked against the schema's `required` and top-level `type`s before the
//! call), and two safe built-ins: [`CurrentTimeTool`] and [`ReadFileTool`] (reads a file inside
//! the agent's workspace, refusing absolute paths, `..` escapes and symlinks that lead outside).
//!
//! A failing tool is not a failed run: its error becomes a `toolResult` with `isError: true`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
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
    /// Runs the tool; `Err` becomes an error tool result.
    fn call(&self, arguments: Value) -> ToolFuture<'_>;
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

    /// The two built-ins, reading files from `workspace`.
    pub fn with_builtins(workspace: impl Into<PathBuf>) -> Self {
        let mut r = Self::new();
        r.register(Arc::new(CurrentTimeTool));
        r.register(Arc::new(ReadFileTool::new(workspace)));
        r
    }

    /// Adds (or replaces) a tool.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.name().to_owned(), tool);
        self.specs = self
            .tools
            .values()
            .map(|t| ToolSpec {
                name: t.name().to_owned(),
                description: t.description().to_owned(),
                parameters: t.parameters(),
            })
            .collect();
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
        let Some(tool) = self.tools.get(name) else {
            let available = self.tools.keys().cloned().collect();
            return Err(ToolError::NotFound { name: name.to_owned(), available });
        };
        validate(&tool.parameters(), &arguments)
            .map_err(|reason| ToolError::InvalidArguments { tool: name.to_owned(), reason })?;
        tool.call(arguments).await
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
    fn call(&self, _arguments: Value) -> ToolFuture<'_> {
        let now = chrono::Utc::now();
        let out = ToolOutput {
            content: vec![json!({"type": "text", "text": now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)})],
            details: Some(json!({"unixMs": now.timestamp_millis()})),
        };
        Box::pin(std::future::ready(Ok(out)))
    }
}

/// `read_file`: a UTF-8 text file inside the workspace directory, at most [`ReadFileTool::MAX_BYTES`].
#[derive(Debug, Clone)]
pub struct ReadFileTool {
    workspace: PathBuf,
}

impl ReadFileTool {
    /// Largest file returned whole; longer files are cut with a note.
    pub const MAX_BYTES: usize = 256 * 1024;

    /// Reads files under `workspace`.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        Self { workspace: workspace.into() }
    }

    /// Resolves `path` (relative to the workspace) to a canonical path inside it, or says why not.
    pub async fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        let rel = Path::new(path);
        if path.is_empty() {
            return Err(ToolError::failed("path is empty"));
        }
        if rel.is_absolute() {
            return Err(ToolError::failed(format!(
                "{path}: absolute paths are refused; give a path relative to the workspace"
            )));
        }
        let root = tokio::fs::canonicalize(&self.workspace)
            .await
            .map_err(|e| ToolError::Failed(format!("workspace {} is not available: {e}", self.workspace.display())))?;
        // canonicalize resolves `..` and every symlink, so the prefix check sees the real location.
        let real =
            tokio::fs::canonicalize(root.join(rel)).await.map_err(|e| ToolError::Failed(format!("{path}: {e}")))?;
        if !real.starts_with(&root) {
            return Err(ToolError::failed(format!("{path}: refused, it resolves outside the workspace")));
        }
        Ok(real)
    }
}

impl Tool for ReadFileTool {
    fn name(&self) -> &str {
        "read_file"
    }
    fn description(&self) -> &str {
        "Reads a UTF-8 text file from the agent's workspace directory. The path is relative to the workspace."
    }
    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "File path relative to the workspace"}},
            "required": ["path"],
            "additionalProperties": false
        })
    }
    fn call(&self, arguments: Value) -> ToolFuture<'_> {
        Box::pin(async move {
            let path = arguments.get("path").and_then(Value::as_str).unwrap_or_default().to_owned();
            let real = self.resolve(&path).await?;
            let meta = tokio::fs::metadata(&real).await.map_err(|e| ToolError::failed(format!("{path}: {e}")))?;
            if !meta.is_file() {
                return Err(ToolError::failed(format!("{path}: not a regular file")));
            }
            let bytes = tokio::fs::read(&real).await.map_err(|e| ToolError::failed(format!("{path}: {e}")))?;
            let total = bytes.len();
            let (slice, cut) =
                if total > Self::MAX_BYTES { (&bytes[..Self::MAX_BYTES], true) } else { (&bytes[..], false) };
            let mut text = match std::str::from_utf8(slice) {
                Ok(s) => s.to_owned(),
                Err(e) if cut && e.error_len().is_none() => {
                    String::from_utf8_lossy(&slice[..e.valid_up_to()]).into_owned()
                }
                Err(_) => return Err(ToolError::failed(format!("{path}: not a UTF-8 text file"))),
            };
            if cut {
                text.push_str(&format!("\n\n[File truncated: showing {} of {total} bytes]", Self::MAX_BYTES));
            }
            Ok(ToolOutput { content: vec![json!({"type": "text", "text": text})], details: None })
        })
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
    async fn read_file_stays_inside_the_workspace() {
        let (ws, outside) = workspace();
        let reg = ToolRegistry::with_builtins(ws.path());
        let read = |p: &str| {
            let call = reg.execute("read_file", json!({"path": p}));
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
        assert_eq!(read("sub").await, Err("sub: not a regular file".to_owned()));
        assert_eq!(read("missing").await, Err("missing: No such file or directory (os error 2)".to_owned()));
    }

    #[tokio::test]
    async fn registry_validates_arguments_and_names() {
        let reg = ToolRegistry::with_builtins("/nonexistent");
        let missing = reg.execute("read_file", json!({})).await.unwrap_err();
        assert_eq!(
            missing,
            ToolError::InvalidArguments {
                tool: "read_file".into(),
                reason: "missing required property \"path\"".into()
            }
        );
        assert_eq!(missing.to_string(), "Invalid arguments for read_file: missing required property \"path\"");
        assert_eq!(
            reg.execute("read_file", json!({"path": 3})).await.map_err(|e| e.to_string()),
            Err("Invalid arguments for read_file: property \"path\" must be of type string, got 3".to_owned())
        );
        let unknown = reg.execute("rm_rf", json!({})).await.unwrap_err();
        assert!(matches!(&unknown, ToolError::NotFound { name, .. } if name == "rm_rf"), "{unknown:?}");
        assert_eq!(unknown.to_string(), "Tool rm_rf not found. Available tools: current_time, read_file");
        let t = reg.execute("current_time", json!({})).await.unwrap();
        let text = t.content[0]["text"].as_str().unwrap();
        assert_eq!(
            chrono::DateTime::parse_from_rfc3339(text).unwrap().timestamp_millis(),
            t.details.unwrap()["unixMs"]
        );
    }
}
