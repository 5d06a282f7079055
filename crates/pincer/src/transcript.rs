//! `pincer transcript …`: context, append, verify, repair, history, export and import over one
//! session file, all through the store library (the same code the gateway uses).

use crate::Failure;
use clap::Subcommand;
use pincer_store::history::{read_history, HistoryOptions, DEFAULT_LIMIT, DEFAULT_MAX_CHARS, MAX_LIMIT};
use pincer_store::{context_report, LeafArg, NewEntry, Session, Store, StoreError, StoreOptions};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum TranscriptCmd {
    /// Print {sessionId, leafId, entries, context} as Pi builds it. Never modifies FILE.
    Context {
        file: PathBuf,
        /// Build the context at this entry id instead of the file's leaf; `null` for before the first entry.
        #[arg(long)]
        leaf: Option<String>,
    },
    /// Append one message entry (lock, FIFO, chained to the leaf, fsync); creates FILE if missing.
    Append {
        file: PathBuf,
        /// The message as JSON, e.g. '{"role":"user","content":"hi","timestamp":0}'.
        #[arg(long)]
        message: String,
        /// Stored as message.idempotencyKey; an append whose key is already present writes nothing.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// The session id for the header when FILE is created.
        #[arg(long)]
        session_id: Option<String>,
    },
    /// Check a file. Exit 0 healthy, 1 problems found, 2 unreadable.
    Verify {
        file: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Fix what verify reports that can be fixed without guessing (atomically, keeping FILE.bak.<ts>).
    Repair { file: PathBuf },
    /// Summarise older turns into a Pi compaction entry (appended; nothing is rewritten).
    Compact {
        file: PathBuf,
        /// The model to summarise with (`provider/model`; default: the configured compaction or agent model).
        #[arg(long)]
        model: Option<String>,
        /// Extra focus for the summary.
        #[arg(long)]
        instructions: Option<String>,
        /// State directory whose pincer.toml configures the providers (default $PINCER_STATE_DIR or ~/.pincer).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Config file (default <state>/pincer.toml).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Export FILE: `html` (one self-contained page with the whole tree and the original JSONL),
    /// `md` (the active branch, or --leaf, as Markdown) or `jsonl` (the file as it is). Never modifies FILE.
    ///
    /// With --session KEY instead of FILE: that session of the configured store (the JSONL state
    /// directory or PostgreSQL, from --config / --state-dir), as Pi v3 JSONL unless --format says otherwise.
    Export {
        #[arg(required_unless_present = "session", conflicts_with = "session")]
        file: Option<PathBuf>,
        /// A session key of the configured store (instead of FILE).
        #[arg(long)]
        session: Option<String>,
        /// Config file naming the store (default <state>/pincer.toml); with --session.
        #[arg(long, requires = "session")]
        config: Option<PathBuf>,
        /// State directory (default $PINCER_STATE_DIR or ~/.pincer); with --session.
        #[arg(long, requires = "session")]
        state_dir: Option<PathBuf>,
        /// html (default for FILE), md or jsonl (default for --session).
        #[arg(long, value_parser = ["html", "md", "markdown", "jsonl"])]
        format: Option<String>,
        /// The branch to show (md) or to open first (html): an entry id; `null` for before the first entry (md).
        #[arg(long)]
        leaf: Option<String>,
        /// Write here instead of stdout (a new file, 0600; an existing one is never overwritten).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Restore a session from an HTML export or a JSONL file into a state directory; prints
    /// {"sessionKey","sessionId","file"}. A clashing session id is replaced by a new one.
    Import {
        input: PathBuf,
        /// State directory (default $PINCER_STATE_DIR or ~/.pincer).
        #[arg(long, env = "PINCER_STATE_DIR")]
        state_dir: Option<PathBuf>,
    },
    /// The messages chat.history would return for FILE.
    History {
        file: PathBuf,
        #[arg(long, default_value_t = DEFAULT_LIMIT)]
        limit: usize,
        #[arg(long, default_value_t = DEFAULT_MAX_CHARS)]
        max_chars: usize,
        #[command(flatten)]
        output: crate::table::OutputArgs,
    },
}

/// `transcript history` on a terminal: one row per message (local time, role with the model of a
/// reply, the text on one line), under a line naming the session.
fn history_table(session_id: Option<&str>, messages: &[Value]) -> String {
    use crate::table::{local_time, message_summary, one_line, Table};
    let mut t = Table::new(&["TIME", "ROLE", "MESSAGE"]);
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("?");
        let kind = m.pointer("/__openclaw/kind").and_then(Value::as_str);
        let who = match (kind, m.get("model").and_then(Value::as_str)) {
            (Some("compaction"), _) => "compaction".to_owned(),
            (_, Some(model)) if role == "assistant" => format!("assistant ({model})"),
            _ => role.to_owned(),
        };
        let mut text = message_summary(m);
        if let Some(err) = m.get("errorMessage").and_then(Value::as_str) {
            text = format!("{text} [error: {err}]").trim().to_owned();
        }
        t.row(vec![local_time(m.get("timestamp").and_then(Value::as_i64)), who, one_line(&text, 100)]);
    }
    format!("session {} · {} messages\n{}", session_id.unwrap_or("-"), messages.len(), t.render())
}

fn print_json(v: &Value) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v).map_err(|e| Failure::failed(format!("writing output: {e}")))?;
    writeln!(out).map_err(|e| Failure::failed(format!("writing output: {e}")))
}

fn store_failure(e: StoreError) -> Failure {
    match e {
        StoreError::InvalidEntry(_) | StoreError::UnknownEntry(_) => Failure::usage(e.to_string()),
        _ => Failure::failed(e.to_string()),
    }
}

pub fn run(cmd: TranscriptCmd) -> Result<u8, Failure> {
    match cmd {
        TranscriptCmd::Context { file, leaf } => {
            let session = Session::read_mapped(&file)
                .map_err(|e| Failure::usage(format!("cannot read: {e}")))?
                .ok_or_else(|| Failure::usage(format!("{}: no such file", file.display())))?;
            let leaf = leaf.as_deref().map(LeafArg::parse).unwrap_or(LeafArg::Default);
            let report = context_report(&session, &leaf).map_err(|e| Failure::usage(format!("--leaf: {e}")))?;
            for w in &report.warnings {
                eprintln!("pincer: warning: {}: {w}", file.display());
            }
            // Messages are written as the raw JSON of the file: no re-encoding of large contexts.
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            report
                .write_json(&mut out)
                .and_then(|_| out.flush())
                .map_err(|e| Failure::failed(format!("writing output: {e}")))?;
            // The process ends next and its memory with it: the index of a large file (100k+
            // entries, each holding shared key text) is not freed piece by piece first.
            std::mem::forget(report);
            std::mem::forget(session);
            Ok(0)
        }
        TranscriptCmd::Append { file, message, idempotency_key, session_id } => {
            let mut msg: Value = serde_json::from_str(&message)
                .map_err(|e| Failure::usage(format!("--message is not valid JSON: {e}")))?;
            let Some(obj) = msg.as_object_mut() else {
                return Err(Failure::usage("--message must be a JSON object (a Pi message with a `role`)"));
            };
            if !obj.get("role").is_some_and(Value::is_string) {
                return Err(Failure::usage("--message needs a string `role` (user, assistant, toolResult, …)"));
            }
            if let Some(k) = idempotency_key {
                if k.trim().is_empty() {
                    return Err(Failure::usage("--idempotency-key must not be empty"));
                }
                obj.insert("idempotencyKey".into(), json!(k));
            }
            if let Some(id) = &session_id {
                if !pincer_store::valid_session_id(id) {
                    return Err(Failure::usage(format!(
                        "--session-id {id:?} must match ^[a-z0-9][a-z0-9._-]{{0,127}}$"
                    )));
                }
            }
            let store = Store::new(StoreOptions::default());
            let a = store.append_with(&file, NewEntry::message(msg), session_id.as_deref());
            store.close();
            let a = a.map_err(store_failure)?;
            print_json(&json!({"id": a.entry["id"], "parentId": a.entry["parentId"], "appended": a.appended}))?;
            Ok(0)
        }
        TranscriptCmd::Verify { file, json } => {
            let report =
                pincer_store::verify::verify(&file).map_err(|e| Failure::usage(format!("{e} (is the path right?)")))?;
            if json {
                print_json(&report.to_json())?;
            } else {
                print!("{}", report.to_text());
            }
            Ok(if report.healthy() { 0 } else { 1 })
        }
        TranscriptCmd::Repair { file } => {
            if !file.exists() {
                return Err(Failure::usage(format!("{}: no such file", file.display())));
            }
            let store = Store::new(StoreOptions::default());
            let r = store.repair(&file);
            store.close();
            let r = r.map_err(store_failure)?;
            match &r.backup {
                None => println!("{}: nothing to repair", file.display()),
                Some(b) => {
                    for p in &r.fixed {
                        println!("fixed [{}] {}", p.kind(), p.message());
                    }
                    println!("{}: repaired; the previous version is kept as {}", file.display(), b.display());
                }
            }
            for p in &r.remaining {
                println!("still there [{}] {}", p.kind(), p.message());
            }
            Ok(if r.remaining.is_empty() { 0 } else { 1 })
        }
        TranscriptCmd::Compact { file, model, instructions, state_dir, config } => {
            if !file.exists() {
                return Err(Failure::usage(format!("{}: no such file", file.display())));
            }
            compact(&file, model, instructions, state_dir, config)
        }
        TranscriptCmd::Export { file, session, config, state_dir, format, leaf, output } => match (file, session) {
            (Some(file), _) => {
                let session = Session::read_mapped(&file)
                    .map_err(|e| Failure::usage(format!("cannot read: {e}")))?
                    .ok_or_else(|| Failure::usage(format!("{}: no such file", file.display())))?;
                export(session, &file, format.as_deref().unwrap_or("html"), leaf.as_deref(), output)
            }
            (None, Some(key)) => {
                let (session, path) = configured_session(&key, config, state_dir)?;
                export(session, &path, format.as_deref().unwrap_or("jsonl"), leaf.as_deref(), output)
            }
            (None, None) => Err(Failure::usage("give FILE or --session KEY")),
        },
        TranscriptCmd::Import { input, state_dir } => import(&input, state_dir),
        TranscriptCmd::History { file, limit, max_chars, output } => {
            if limit == 0 || limit > MAX_LIMIT {
                return Err(Failure::usage(format!("--limit must be between 1 and {MAX_LIMIT}")));
            }
            if max_chars == 0 {
                return Err(Failure::usage("--max-chars must be at least 1"));
            }
            if !file.exists() {
                return Err(Failure::usage(format!("{}: no such file", file.display())));
            }
            let h = read_history(&file, HistoryOptions { limit, max_chars, before: None })
                .map_err(|e| Failure::usage(format!("{}: cannot read: {e}", file.display())))?;
            if output.json() {
                print_json(&json!({"sessionId": h.session_id, "messages": h.messages}))?;
            } else {
                print!("{}", history_table(h.session_id.as_deref(), &h.messages));
            }
            Ok(0)
        }
    }
}

fn compact(
    file: &Path,
    model: Option<String>,
    instructions: Option<String>,
    state_dir: Option<PathBuf>,
    config: Option<PathBuf>,
) -> Result<u8, Failure> {
    use pincer_gateway::config::{self, Overrides};
    let settings = config::load(&Overrides { offline: true, bind: None, state_dir, config })
        .map_err(|e| Failure::usage(e.to_string()))?;
    let spec = model.or(settings.compaction.model.clone()).unwrap_or_else(|| settings.model.clone());
    let resolved = settings.providers.resolve(&spec).map_err(|e| Failure::usage(format!("--model: {e}")))?;
    let mut compaction = settings.compaction.clone();
    if instructions.is_some() {
        compaction.custom_instructions = instructions;
    }
    let redactor = settings.redactor().map_err(Failure::usage)?;
    let store = Store::new(StoreOptions { redactor, ..StoreOptions::default() });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::failed(format!("cannot start the runtime: {e}")))?;
    let outcome = runtime
        .block_on(pincer_compaction::compact(
            file,
            &store,
            &resolved,
            &compaction,
            pincer_compaction::CompactionReason::Manual,
            pincer_agent::CancellationToken::new(),
        ))
        .map_err(|e| Failure::failed(format!("{}: {e}", file.display())));
    store.close();
    let outcome = outcome?;
    print_json(&json!({
        "compacted": true,
        "id": outcome.entry["id"],
        "parentId": outcome.entry["parentId"],
        "firstKeptEntryId": outcome.first_kept_entry_id,
        "tokensBefore": outcome.tokens_before,
        "summarizedMessages": outcome.summarized_messages,
    }))?;
    Ok(0)
}

/// The session `key` of the store the config names, and its transcript's path (for messages).
fn configured_session(
    key: &str,
    config: Option<PathBuf>,
    state_dir: Option<PathBuf>,
) -> Result<(Session, PathBuf), Failure> {
    let settings = pincer_gateway::config::load(&pincer_gateway::config::Overrides {
        offline: true,
        bind: None,
        state_dir,
        config,
    })
    .map_err(|e| Failure::usage(e.to_string()))?;
    let store = pincer_gateway::state::open_transcripts(&settings).map_err(|e| Failure::failed(e.to_string()))?;
    let sessions = pincer_gateway::sessions::Sessions::new(&settings.state_dir, store.clone());
    let s = sessions
        .resolve(key, false)
        .map_err(|e| Failure::usage(e.message))?
        .ok_or_else(|| Failure::usage(format!("--session {key}: no such session in the configured store")))?;
    let session = store
        .read_session(&s.path)
        .map_err(|e| Failure::failed(format!("cannot read {}: {e}", s.key)))?
        .ok_or_else(|| Failure::usage(format!("--session {key}: the session has no transcript yet")))?;
    Ok((session, s.path))
}

fn export(
    session: Session,
    file: &Path,
    format: &str,
    leaf: Option<&str>,
    output: Option<PathBuf>,
) -> Result<u8, Failure> {
    let format = pincer_export::Format::parse(format)
        .ok_or_else(|| Failure::usage(format!("--format {format:?}: expected html, md or jsonl")))?;
    if session.header.is_none() {
        return Err(Failure::usage(format!(
            "{}: no valid session header (not a Pi session; `pincer transcript verify` says more)",
            file.display()
        )));
    }
    if let Some(id) = leaf.filter(|l| *l != "null") {
        if !session.by_id.contains_key(id) {
            return Err(Failure::usage(format!("--leaf: unknown entry id {id:?} in {}", file.display())));
        }
    }
    let bytes = match format {
        pincer_export::Format::Jsonl => session.bytes().to_vec(),
        pincer_export::Format::Markdown => {
            let leaf = leaf.map(LeafArg::parse).unwrap_or(LeafArg::Default);
            pincer_export::markdown(&session, &leaf).map_err(|e| Failure::usage(e.to_string()))?.into_bytes()
        }
        pincer_export::Format::Html => pincer_export::html(&session, leaf.filter(|l| *l != "null")).into_bytes(),
    };
    match output {
        Some(out) => {
            if same_file(&out, file) {
                return Err(Failure::usage(format!("--output {} is the transcript itself", out.display())));
            }
            pincer_store::files::write_export(&out, &bytes).map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    Failure::usage(format!("--output {} exists; nothing written (choose a new file)", out.display()))
                }
                _ => Failure::failed(format!("{}: cannot write: {e}", out.display())),
            })?;
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes)
                .and_then(|_| out.flush())
                .map_err(|e| Failure::failed(format!("writing output: {e}")))?;
        }
    }
    Ok(0)
}

/// True when both paths name one existing file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

fn import(input: &Path, state_dir: Option<PathBuf>) -> Result<u8, Failure> {
    let bytes = std::fs::read(input).map_err(|e| Failure::usage(format!("{}: cannot read: {e}", input.display())))?;
    let prepared =
        pincer_export::prepare_import(&bytes).map_err(|e| Failure::usage(format!("{}: {e}", input.display())))?;
    let dir = state_dir.unwrap_or_else(pincer_gateway::config::default_state_dir);
    let store = Store::new(StoreOptions::default());
    let sessions = pincer_gateway::sessions::Sessions::new(&dir, std::sync::Arc::new(store.clone()));
    let r = sessions.import(&prepared);
    store.close();
    let s = r.map_err(|e| Failure::failed(e.message))?;
    print_json(&json!({"sessionKey": s.key, "sessionId": s.session_id, "file": s.path.display().to_string()}))?;
    Ok(0)
}
