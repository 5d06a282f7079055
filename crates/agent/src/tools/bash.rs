//! Pi's `bash` tool (`dist/core/tools/bash.js` and `output-accumulator.js` of
//! `@mariozechner/pi-coding-agent` 0.73.1): the same name, schema, texts and result shape, run in a
//! bubblewrap sandbox ([`Sandbox::Bwrap`]) over the agent's workspace.
//!
//! stdout and stderr are read together; the last 2,000 lines / 50 KB are kept with Pi's notice and
//! `details.truncation`, the whole output goes to `pi-bash-<hex>.log` (0600) in a private directory
//! of the gateway, named in `details.fullOutputPath`. While it runs, the output so far is reported
//! as Pi reports it ([`ToolUpdates`]): an empty partial at the start, then the same tail (without
//! the notice) at most every [`UPDATE_THROTTLE`]. The command runs in its own process group
//! (and, sandboxed, its own PID namespace): on timeout, and when the call's future is dropped
//! (the run was aborted), the whole group is killed.
//!
//! Why this module writes a file itself (clippy keeps std's file writers in the store): the full
//! output is a log of the user's command, not a transcript; it is written only here, to a new
//! 0600 file in a 0700 directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::truncate::{format_size, truncate_tail, MAX_BYTES, MAX_LINES};
use super::workspace::Workspace;
use super::{Tool, ToolError, ToolFuture, ToolOutput, ToolUpdates};

/// How `bash` commands are confined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sandbox {
    /// bubblewrap, the program at this path.
    Bwrap(PathBuf),
    /// No sandbox (`sandbox = "off"`): the command sees what the gateway sees.
    Off,
}

/// The settings of `bash` (`[agents.defaults.tools]` `sandbox`, `network`, `timeout`).
#[derive(Debug, Clone)]
pub struct BashConfig {
    pub sandbox: Sandbox,
    /// Keep the network (`network = true`); off by default.
    pub network: bool,
    /// The timeout of a call that gives none (10 minutes by default).
    pub default_timeout: Duration,
    /// Paths never visible in the sandbox: the state directory, the config file.
    pub hidden: Vec<PathBuf>,
    /// Where full outputs are saved (created 0700 at first use).
    pub output_dir: PathBuf,
}

/// Default of [`BashConfig::default_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Pi's grace for the pipes after the shell exited (`EXIT_STDIO_GRACE_MS`).
const EXIT_STDIO_GRACE: Duration = Duration::from_millis(100);

/// Least time between two partial results of one call (Pi's `BASH_UPDATE_THROTTLE_MS`).
pub const UPDATE_THROTTLE: Duration = Duration::from_millis(100);

/// The system directories bound read-only into the sandbox (symlinks are recreated as symlinks).
const SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"];

impl BashConfig {
    /// `bwrap` from `PATH`, or an error saying how to get it.
    pub fn find_bwrap() -> Result<PathBuf, String> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        std::env::split_paths(&path).map(|d| d.join("bwrap")).find(|p| p.is_file()).ok_or_else(|| {
            "bubblewrap (bwrap) is not installed; install it (Debian: apt-get install bubblewrap)".into()
        })
    }

    /// Checks that a command can run in the sandbox over `workspace` (a startup check): runs `true`.
    pub fn probe(&self, workspace: &Path) -> Result<(), String> {
        let Sandbox::Bwrap(bwrap) = &self.sandbox else { return Ok(()) };
        std::fs::create_dir_all(workspace).map_err(|e| format!("workspace {}: {e}", workspace.display()))?;
        let ws = std::fs::canonicalize(workspace).map_err(|e| format!("workspace {}: {e}", workspace.display()))?;
        let args = self.sandbox_args(&ws)?;
        let out = std::process::Command::new(bwrap)
            .args(&args)
            .args(["/bin/sh", "-c", "true"])
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", bwrap.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} does not work here ({}): {}",
                bwrap.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// bubblewrap's arguments up to the command: system directories read-only, the workspace
    /// read-write, the hidden paths masked, a private `/tmp`, `/proc` and `/dev`, every namespace
    /// new (the network too unless [`BashConfig::network`]).
    fn sandbox_args(&self, ws: &Path) -> Result<Vec<OsString>, String> {
        let hidden: Vec<PathBuf> =
            self.hidden.iter().map(|h| std::fs::canonicalize(h).unwrap_or_else(|_| h.clone())).collect();
        if let Some(h) = hidden.iter().find(|h| h.as_path() == ws) {
            return Err(format!(
                "the workspace {} is the state directory or config file {}",
                ws.display(),
                h.display()
            ));
        }
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |items: &[&std::ffi::OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
        push(&["--die-with-parent".as_ref(), "--new-session".as_ref(), "--unshare-all".as_ref()]);
        if self.network {
            push(&["--share-net".as_ref()]);
        }
        for dir in SYSTEM_DIRS {
            let p = Path::new(dir);
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(p) {
                        push(&["--symlink".as_ref(), target.as_os_str(), p.as_os_str()]);
                    }
                }
                Ok(m) if m.is_dir() => push(&["--ro-bind".as_ref(), p.as_os_str(), p.as_os_str()]),
                _ => {}
            }
        }
        push(&[
            "--proc".as_ref(),
            "/proc".as_ref(),
            "--dev".as_ref(),
            "/dev".as_ref(),
            "--tmpfs".as_ref(),
            "/tmp".as_ref(),
        ]);
        // The full outputs, read-only where `details.fullOutputPath` and Pi's note say they are, so a
        // later command can page through one (bound once the first one was saved).
        let out = self.output_dir.as_os_str();
        push(&["--ro-bind-try".as_ref(), out, out]);
        let mask = |a: &mut Vec<OsString>, h: &Path| {
            if h.is_dir() {
                a.extend(["--tmpfs".into(), h.as_os_str().to_owned()]);
            } else if h.exists() {
                a.extend(["--ro-bind".into(), "/dev/null".into(), h.as_os_str().to_owned()]);
            }
        };
        // Secrets under a system directory are masked; then the workspace is bound (over a mask
        // when it lies inside one); then secrets inside the workspace are masked.
        for h in hidden.iter().filter(|h| SYSTEM_DIRS.iter().any(|d| h.starts_with(d)) && !h.starts_with(ws)) {
            mask(&mut a, h);
        }
        a.extend(["--bind".into(), ws.as_os_str().to_owned(), ws.as_os_str().to_owned()]);
        for h in hidden.iter().filter(|h| h.starts_with(ws)) {
            mask(&mut a, h);
        }
        a.extend(["--chdir".into(), ws.as_os_str().to_owned()]);
        Ok(a)
    }

    /// The private directory of full outputs, created 0700 (with its parents) if missing.
    async fn output_dir(&self) -> Result<PathBuf, ToolError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = self.output_dir.clone();
        let made = tokio::task::spawn_blocking(move || {
            match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(dir),
            }
        })
        .await
        .map_err(|e| ToolError::failed(e.to_string()))?;
        made.map_err(|e| ToolError::failed(format!("cannot create {}: {e}", self.output_dir.display())))
    }
}

/// `bash {command, timeout?}`.
pub struct BashTool {
    pub workspace: Arc<Workspace>,
    pub config: Arc<BashConfig>,
}

/// The shell: `/bin/bash` when it exists, else `sh` (Pi's `getShellConfig`).
fn shell() -> &'static str {
    if Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "sh"
    }
}

/// A number as JavaScript prints it (`2`, `1.5`).
fn js_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        #[allow(clippy::cast_possible_truncation)] // whole and small
        let i = n as i64;
        i.to_string()
    } else {
        n.to_string()
    }
}

impl Tool for BashTool {
    fn name(&self) -> &str {
        "bash"
    }
    fn description(&self) -> &str {
        "Execute a bash command in the current working directory. Returns stdout and stderr. Output is truncated to last 2000 lines or 50KB (whichever is hit first). If truncated, full output is saved to a temp file. Optionally provide a timeout in seconds."
    }
    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {
            "command": {"type": "string", "description": "Bash command to execute"},
            "timeout": {"type": "number", "description": "Timeout in seconds (optional, no default timeout)"}},
            "required": ["command"]})
    }
    fn call(&self, args: Value) -> ToolFuture<'_> {
        self.call_with_updates(args, ToolUpdates::none())
    }
    fn call_with_updates(&self, args: Value, updates: ToolUpdates) -> ToolFuture<'_> {
        Box::pin(async move {
            let command = args.get("command").and_then(Value::as_str).unwrap_or_default().to_owned();
            // Pi: a positive timeout in seconds; none (or not positive) falls back to the configured default.
            let timeout = args.get("timeout").and_then(Value::as_f64).filter(|t| *t > 0.0 && t.is_finite());
            let (limit, shown) = match timeout {
                Some(t) => (Duration::from_secs_f64(t.min(1e9)), js_number(t)),
                None => (self.config.default_timeout, self.config.default_timeout.as_secs().to_string()),
            };
            let ws = self.workspace.real_root().await?;
            run(&self.config, &ws, &command, limit, &shown, &updates).await
        })
    }
}

/// The environment of the command: nothing of the gateway's (its token, API keys) but the locale.
fn environment(config: &BashConfig, ws: &Path) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = ["LANG", "LC_ALL", "LC_CTYPE", "TZ"]
        .iter()
        .filter_map(|k| std::env::var_os(k).map(|v| ((*k).into(), v)))
        .collect();
    if let Some(id) = super::current_call_id() {
        env.push(("PINCER_TOOL_CALL_ID".into(), (*id).into()));
    }
    match config.sandbox {
        Sandbox::Bwrap(_) => {
            env.push(("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()));
            env.push(("HOME".into(), ws.as_os_str().to_owned()));
        }
        Sandbox::Off => {
            env.extend(["PATH", "HOME"].iter().filter_map(|k| std::env::var_os(k).map(|v| ((*k).into(), v))));
        }
    }
    env
}

/// A spawned command whose process group is killed when this is dropped while armed.
struct Group {
    child: tokio::process::Child,
    pgid: Option<rustix::process::Pid>,
}

impl Group {
    fn kill(&mut self) {
        if let Some(pgid) = self.pgid.take() {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn run(
    config: &BashConfig,
    ws: &Path,
    command: &str,
    limit: Duration,
    shown: &str,
    updates: &ToolUpdates,
) -> Result<ToolOutput, ToolError> {
    let mut cmd = match &config.sandbox {
        Sandbox::Bwrap(bwrap) => {
            let mut c = tokio::process::Command::new(bwrap);
            c.args(config.sandbox_args(ws).map_err(ToolError::failed)?);
            c.args([shell(), "-c", command]);
            c
        }
        Sandbox::Off => {
            let mut c = tokio::process::Command::new(shell());
            c.args(["-c", command]);
            c
        }
    };
    cmd.env_clear()
        .envs(environment(config, ws))
        .current_dir(ws)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| ToolError::failed(format!("cannot run bash: {e}")))?;
    let pgid = child.id().and_then(|id| rustix::process::Pid::from_raw(i32::try_from(id).unwrap_or(0)));
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let mut group = Group { child, pgid };
    let mut acc = Accumulator::new(config);
    let mut partials = Partials::new(updates);
    let (mut buf_out, mut buf_err) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let deadline = tokio::time::Instant::now() + limit;
    let mut status: Option<std::process::ExitStatus> = None;
    let mut timed_out = false;
    let mut grace: Option<tokio::time::Instant> = None;
    while out.is_some() || err.is_some() || status.is_none() {
        let far = tokio::time::Instant::now() + Duration::from_secs(86_400);
        tokio::select! {
            n = read_some(&mut out, &mut buf_out), if out.is_some() => match n {
                Some(n) => {
                    acc.append(&buf_out[..n]).await?;
                    partials.output(&acc);
                }
                None => out = None,
            },
            n = read_some(&mut err, &mut buf_err), if err.is_some() => match n {
                Some(n) => {
                    acc.append(&buf_err[..n]).await?;
                    partials.output(&acc);
                }
                None => err = None,
            },
            () = tokio::time::sleep_until(partials.due.unwrap_or(far)), if partials.due.is_some() => partials.send(&acc),
            s = group.child.wait(), if status.is_none() => {
                status = Some(s.map_err(|e| ToolError::failed(format!("bash: {e}")))?);
                group.pgid = None; // reaped: its group id may be reused, never kill it now
                grace = Some(tokio::time::Instant::now() + EXIT_STDIO_GRACE);
            },
            () = tokio::time::sleep_until(deadline), if !timed_out && status.is_none() => {
                timed_out = true;
                group.kill();
            },
            () = tokio::time::sleep_until(grace.unwrap_or(far)), if grace.is_some() => break,
        }
    }
    acc.finish().await?;
    if partials.due.is_some() {
        partials.send(&acc);
    }
    let (text, details) = acc.format("(no output)");
    if timed_out {
        let (text, _) = acc.format("");
        return Err(ToolError::failed(append_status(&text, &format!("Command timed out after {shown} seconds"))));
    }
    if let Some(code) = status.and_then(|s| s.code()).filter(|c| *c != 0) {
        return Err(ToolError::failed(append_status(&text, &format!("Command exited with code {code}"))));
    }
    Ok(ToolOutput { content: vec![json!({"type": "text", "text": text})], details })
}

/// Pi's throttle of partial results: the first output at once, then at most one partial every
/// [`UPDATE_THROTTLE`], the last output never left unreported.
struct Partials<'a> {
    updates: &'a ToolUpdates,
    last: Option<tokio::time::Instant>,
    /// When the next partial goes out, if output came since the last.
    due: Option<tokio::time::Instant>,
}

impl<'a> Partials<'a> {
    fn new(updates: &'a ToolUpdates) -> Self {
        // Pi announces the run with an empty partial.
        updates.report(ToolOutput { content: Vec::new(), details: None });
        Partials { updates, last: None, due: None }
    }

    /// New output came: report it now, or when the throttle allows.
    fn output(&mut self, acc: &Accumulator<'_>) {
        if !self.updates.wanted() || self.due.is_some() {
            return;
        }
        let now = tokio::time::Instant::now();
        match self.last.map(|l| l + UPDATE_THROTTLE).filter(|at| *at > now) {
            Some(at) => self.due = Some(at),
            None => self.send(acc),
        }
    }

    fn send(&mut self, acc: &Accumulator<'_>) {
        self.due = None;
        self.last = Some(tokio::time::Instant::now());
        self.updates.report(acc.partial());
    }
}

/// Pi's `appendStatus`.
fn append_status(text: &str, status: &str) -> String {
    if text.is_empty() {
        status.to_owned()
    } else {
        format!("{text}\n\n{status}")
    }
}

/// The next chunk of `pipe`; `None` at its end (or on a read error).
async fn read_some<R: AsyncRead + Unpin>(pipe: &mut Option<R>, buf: &mut [u8]) -> Option<usize> {
    let p = pipe.as_mut()?;
    match p.read(buf).await {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

/// Pi's `OutputAccumulator`: bounded memory (a decoded tail), the totals, and the full output in a
/// file once it passes a cap.
struct Accumulator<'a> {
    config: &'a BashConfig,
    /// Undecoded bytes of an incomplete UTF-8 sequence at the end of the last chunk.
    pending: Vec<u8>,
    tail: String,
    tail_starts_at_line_boundary: bool,
    total_raw: usize,
    total_decoded: usize,
    total_lines: usize,
    current_line_bytes: usize,
    raw: Vec<u8>,
    file: Option<(PathBuf, tokio::fs::File)>,
}

const MAX_ROLLING: usize = MAX_BYTES * 2;

impl<'a> Accumulator<'a> {
    fn new(config: &'a BashConfig) -> Self {
        Accumulator {
            config,
            pending: Vec::new(),
            tail: String::new(),
            tail_starts_at_line_boundary: true,
            total_raw: 0,
            total_decoded: 0,
            total_lines: 1,
            current_line_bytes: 0,
            raw: Vec::new(),
            file: None,
        }
    }

    async fn append(&mut self, data: &[u8]) -> Result<(), ToolError> {
        self.total_raw += data.len();
        let mut bytes = std::mem::take(&mut self.pending);
        bytes.extend_from_slice(data);
        let mut text = String::new();
        let mut rest = &bytes[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    text.push_str(s);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    text.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        None => {
                            self.pending = bad.to_vec();
                            break;
                        }
                        Some(n) => {
                            text.push('\u{FFFD}');
                            rest = &bad[n..];
                        }
                    }
                }
            }
        }
        self.append_text(&text);
        if self.file.is_some() || self.should_use_file() {
            self.ensure_file().await?;
            self.write(data).await
        } else {
            self.raw.extend_from_slice(data);
            Ok(())
        }
    }

    async fn finish(&mut self) -> Result<(), ToolError> {
        if !self.pending.is_empty() {
            self.pending.clear();
            self.append_text("\u{FFFD}");
        }
        if self.should_use_file() {
            self.ensure_file().await?;
        }
        if let Some((path, f)) = &mut self.file {
            f.flush().await.map_err(|e| {
                ToolError::failed(format!("bash: cannot save the full output to {}: {e}", path.display()))
            })?;
        }
        Ok(())
    }

    fn append_text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        self.total_decoded += text.len();
        self.tail.push_str(text);
        if self.tail.len() > MAX_ROLLING * 2 {
            let mut start = self.tail.len() - MAX_ROLLING;
            while !self.tail.is_char_boundary(start) {
                start += 1;
            }
            self.tail_starts_at_line_boundary = self.tail.as_bytes()[start - 1] == b'\n';
            self.tail.drain(..start);
        }
        match memchr::memrchr(b'\n', text.as_bytes()) {
            None => self.current_line_bytes += text.len(),
            Some(last) => {
                self.total_lines += memchr::memchr_iter(b'\n', text.as_bytes()).count();
                self.current_line_bytes = text.len() - last - 1;
            }
        }
    }

    fn should_use_file(&self) -> bool {
        self.total_raw > MAX_BYTES || self.total_decoded > MAX_BYTES || self.total_lines > MAX_LINES
    }

    #[allow(clippy::disallowed_methods, clippy::disallowed_types)] // the full output log; see the module doc
    async fn ensure_file(&mut self) -> Result<(), ToolError> {
        if self.file.is_some() {
            return Ok(());
        }
        let dir = self.config.output_dir().await?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = dir.join(format!("pi-bash-{}.log", &id[..16]));
        let f =
            tokio::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).await.map_err(|e| {
                ToolError::failed(format!("bash: cannot save the full output to {}: {e}", path.display()))
            })?;
        self.file = Some((path, f));
        let raw = std::mem::take(&mut self.raw);
        self.write(&raw).await
    }

    async fn write(&mut self, data: &[u8]) -> Result<(), ToolError> {
        if let Some((path, f)) = &mut self.file {
            f.write_all(data).await.map_err(|e| {
                ToolError::failed(format!("bash: cannot save the full output to {}: {e}", path.display()))
            })?;
        }
        Ok(())
    }

    /// Pi's `snapshot`: the tail of the output kept (2,000 lines / 50 KB), with the totals.
    fn snapshot(&self) -> super::truncate::Truncation {
        let text = if self.tail_starts_at_line_boundary {
            &self.tail[..]
        } else {
            self.tail.split_once('\n').map_or(&self.tail[..], |(_, rest)| rest)
        };
        let mut t = truncate_tail(text, MAX_LINES, MAX_BYTES);
        let truncated = self.total_lines > MAX_LINES || self.total_decoded > MAX_BYTES;
        t.truncated_by = if truncated {
            t.truncated_by.or(Some(if self.total_decoded > MAX_BYTES { "bytes" } else { "lines" }))
        } else {
            None
        };
        t.truncated = truncated;
        t.total_lines = self.total_lines;
        t.total_bytes = self.total_decoded;
        t
    }

    /// The full output's file, once there is one.
    fn path(&self) -> Option<String> {
        self.file.as_ref().map(|(p, _)| p.display().to_string())
    }

    /// Pi's partial result: the snapshot's text (no notice), `details.truncation` when truncated
    /// and `details.fullOutputPath` once the full output has a file.
    fn partial(&self) -> ToolOutput {
        let t = self.snapshot();
        let mut details = serde_json::Map::new();
        if t.truncated {
            details.insert("truncation".into(), t.to_value());
        }
        if let Some(path) = self.path() {
            details.insert("fullOutputPath".into(), path.into());
        }
        ToolOutput { content: vec![json!({"type": "text", "text": t.content})], details: Some(Value::Object(details)) }
    }

    /// Pi's `formatOutput` of the final snapshot: the text (or `empty`) with the truncation notice,
    /// and `{truncation, fullOutputPath}` when truncated.
    fn format(&self, empty: &str) -> (String, Option<Value>) {
        let t = self.snapshot();
        let truncated = t.truncated;
        let mut text = if t.content.is_empty() { empty.to_owned() } else { t.content.clone() };
        if !truncated {
            return (text, None);
        }
        let path = self.path().unwrap_or_default();
        let end = t.total_lines;
        let start = end - t.output_lines + 1;
        if t.last_line_partial {
            text.push_str(&format!(
                "\n\n[Showing last {} of line {end} (line is {}). Full output: {path}]",
                format_size(t.output_bytes),
                format_size(self.current_line_bytes)
            ));
        } else if t.truncated_by == Some("lines") {
            text.push_str(&format!("\n\n[Showing lines {start}-{end} of {end}. Full output: {path}]"));
        } else {
            text.push_str(&format!(
                "\n\n[Showing lines {start}-{end} of {end} ({} limit). Full output: {path}]",
                format_size(MAX_BYTES)
            ));
        }
        (text, Some(json!({"truncation": t.to_value(), "fullOutputPath": path})))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::disallowed_methods)]
    use super::*;

    fn tool(ws: &Path, hidden: Vec<PathBuf>, out: &Path) -> BashTool {
        let config = BashConfig {
            sandbox: Sandbox::Bwrap(BashConfig::find_bwrap().unwrap()),
            network: false,
            default_timeout: DEFAULT_TIMEOUT,
            hidden,
            output_dir: out.join("outputs/agent"),
        };
        config.probe(ws).unwrap();
        BashTool { workspace: Workspace::new(ws), config: Arc::new(config) }
    }

    async fn bash(t: &BashTool, args: Value) -> Result<String, String> {
        t.call(args).await.map(|o| o.content[0]["text"].as_str().unwrap().to_owned()).map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn secrets_inside_the_workspace_are_masked_and_timeouts_kill() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join(".state")).unwrap();
        std::fs::write(ws.join(".state/gateway.token"), "s3cret").unwrap();
        std::fs::write(ws.join("pincer.toml"), "token = \"s3cret\"").unwrap();
        std::fs::write(ws.join("notes.txt"), "visible").unwrap();
        let t = tool(&ws, vec![ws.join(".state"), ws.join("pincer.toml")], dir.path());
        assert_eq!(bash(&t, json!({"command": "cat notes.txt; ls -A .state"})).await, Ok("visible".into()));
        // A hidden file is bound over by /dev/null, which the sandbox may not open (nodev).
        let toml = bash(&t, json!({"command": "cat pincer.toml"})).await.unwrap_err();
        assert!(toml.starts_with("cat: pincer.toml: Permission denied") && !toml.contains("s3cret"), "{toml}");
        assert_eq!(
            bash(&t, json!({"command": "cat .state/gateway.token"})).await,
            Err("cat: .state/gateway.token: No such file or directory\n\n\nCommand exited with code 1".into())
        );
        assert_eq!(bash(&t, json!({"command": "true"})).await, Ok("(no output)".into()));
        assert_eq!(
            bash(&t, json!({"command": "echo started; sleep 30", "timeout": 0.5})).await,
            Err("started\n\n\nCommand timed out after 0.5 seconds".into())
        );
        // A full output can be read back from the sandbox, where Pi's note says it is.
        let big = bash(&t, json!({"command": "seq 1 3000"})).await.unwrap();
        let path = big.rsplit_once("Full output: ").unwrap().1.trim_end_matches(']').to_owned();
        assert!(path.starts_with(&dir.path().join("outputs/agent").display().to_string()), "{path}");
        assert_eq!(
            bash(&t, json!({"command": format!("wc -l < {path}; head -n 2 {path}")})).await,
            Ok("3000\n1\n2\n".into())
        );
        assert!(bash(&t, json!({"command": format!("echo x >> {path}")}))
            .await
            .unwrap_err()
            .contains("Read-only file system"));
        // The workspace being the state directory itself is refused.
        let same = BashConfig { hidden: vec![ws.clone()], ..(*t.config).clone() };
        assert!(same.probe(&ws).unwrap_err().contains("is the state directory"));
    }
}
