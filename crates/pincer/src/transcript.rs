//! `pincer transcript …`: context, append, verify, repair, history, export and import over one
//! session file, all through the store library (the same code the gateway uses).

use crate::Failure;
use clap::{Args, Subcommand};
use pincer_gateway::config::{Overrides, Settings, StoreSettings};
use pincer_store::history::{read_history, HistoryOptions, DEFAULT_LIMIT, DEFAULT_MAX_CHARS, MAX_LIMIT};
use pincer_store::{
    context_report, LeafArg, NewEntry, Session, Store, StoreError, StoreOptions, Transcripts, TranscriptsExt,
};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The transcript a command works on: FILE, or `--session KEY` of the store the config names
/// (the JSONL state directory or PostgreSQL).
#[derive(Args)]
pub struct Target {
    /// The transcript file (or --session KEY).
    #[arg(required_unless_present = "session", conflicts_with = "session")]
    file: Option<PathBuf>,
    /// A session key (`main`, `agent:main:trip`; `pincer sessions list` shows them) instead of FILE.
    #[arg(long)]
    session: Option<String>,
    /// Config file naming the store (default <state>/pincer.toml); with --session.
    #[arg(long, requires = "session")]
    config: Option<PathBuf>,
    /// State directory (default $PINCER_STATE_DIR or ~/.pincer); with --session.
    #[arg(long, requires = "session")]
    state_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum TranscriptCmd {
    /// Print {sessionId, leafId, entries, context} as Pi builds it. Never modifies the transcript.
    Context {
        #[command(flatten)]
        target: Target,
        /// Build the context at this entry id instead of the file's leaf; `null` for before the first entry.
        #[arg(long)]
        leaf: Option<String>,
    },
    /// Append one message entry (lock, FIFO, chained to the leaf, fsync); creates FILE if missing.
    Append {
        #[command(flatten)]
        target: Target,
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
    /// Check a transcript. Exit 0 healthy, 1 problems found, 2 unreadable.
    Verify {
        #[command(flatten)]
        target: Target,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Fix what verify reports that can be fixed without guessing (atomically, keeping FILE.bak.<ts>).
    Repair {
        #[command(flatten)]
        target: Target,
    },
    /// Summarise older turns into a Pi compaction entry (appended; nothing is rewritten).
    Compact {
        /// The transcript file (or --session KEY).
        #[arg(required_unless_present = "session", conflicts_with = "session")]
        file: Option<PathBuf>,
        /// A session key of the configured store instead of FILE.
        #[arg(long)]
        session: Option<String>,
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
    /// Export a transcript: `html` (one self-contained page with the whole tree and the original
    /// JSONL), `md` (the active branch, or --leaf, as Markdown) or `jsonl` (the file as it is).
    /// Never modifies the transcript.
    Export {
        #[command(flatten)]
        target: Target,
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
    /// The messages chat.history would return for a transcript.
    History {
        #[command(flatten)]
        target: Target,
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
    let mut t = Table::new(&["TIME", "ROLE", "MESSAGE"]).flex(2);
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
    crate::out::json_pretty(v)
}

fn store_failure(e: StoreError) -> Failure {
    match e {
        StoreError::InvalidEntry(_) | StoreError::UnknownEntry(_) => Failure::usage(e.to_string()),
        _ => Failure::failed(e.to_string()),
    }
}

/// What a command needs of the configuration when it is given `--session`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// The store only: providers are not built, so their API keys need not be set.
    Store,
    /// Everything, providers included (a command that writes what the redactor must see).
    All,
}

/// Where a [`Target`] is.
struct Located {
    path: PathBuf,
    /// How messages name it: the file's path, or `--session KEY`.
    name: String,
    /// With --session: the configured store and its settings.
    configured: Option<(Arc<dyn Transcripts>, Box<Settings>)>,
    /// The session id the index gives (with --session), for a transcript not created yet.
    session_id: Option<String>,
}

impl Located {
    /// True when the transcript is in PostgreSQL (there is no file to open).
    fn in_database(&self) -> bool {
        self.configured.as_ref().is_some_and(|(_, s)| !matches!(s.store, StoreSettings::Jsonl))
    }

    /// The file, for a command that works on JSONL files only.
    fn file(&self, command: &str) -> Result<&Path, Failure> {
        if self.in_database() {
            return Err(Failure::usage(format!(
                "`transcript {command}` works on JSONL files, and the configured store is PostgreSQL \
                 (`pincer transcript export {} --format jsonl` gives the transcript as a file)",
                self.name
            )));
        }
        Ok(&self.path)
    }

    /// The whole transcript; an error when there is none.
    fn read(&self) -> Result<Session, Failure> {
        let read = match &self.configured {
            Some((store, _)) if self.in_database() => store.read_session(&self.path),
            _ => Session::read_mapped(&self.path),
        };
        read.map_err(|e| Failure::usage(format!("cannot read {}: {e}", self.name)))?.ok_or_else(|| self.missing())
    }

    /// The error for a transcript that does not exist.
    fn missing(&self) -> Failure {
        match self.configured {
            None => Failure::usage(format!("no such file: {}", self.name)),
            Some(_) => Failure::usage(format!("{} has no transcript yet (no message was sent)", self.name)),
        }
    }
}

/// Finds FILE, or the transcript of `--session KEY` in the configured store.
fn locate(target: Target, needs: Needs) -> Result<Located, Failure> {
    let Target { file, session, config, state_dir } = target;
    if let Some(file) = file {
        return Ok(Located { name: file.display().to_string(), path: file, configured: None, session_id: None });
    }
    let Some(key) = session else { return Err(Failure::usage("give FILE or --session KEY")) };
    let settings = pincer_gateway::config::load(&Overrides {
        offline: true,
        skip_providers: needs == Needs::Store,
        bind: None,
        state_dir,
        config,
    })
    .map_err(|e| Failure::usage(e.to_string()))?;
    let store = pincer_gateway::state::open_transcripts(&settings).map_err(|e| Failure::failed(e.to_string()))?;
    let sessions = pincer_gateway::sessions::Sessions::new(&settings.state_dir, store.clone());
    let s = sessions.resolve(&key, false).map_err(|e| Failure::usage(format!("--session {key}: {e}")))?.ok_or_else(
        || {
            Failure::usage(format!(
                "no session {key:?} in {} (`pincer sessions list --state-dir {}` lists the keys)",
                settings.state_dir.display(),
                settings.state_dir.display()
            ))
        },
    )?;
    Ok(Located {
        path: s.path,
        name: format!("--session {}", s.key),
        configured: Some((store, Box::new(settings))),
        session_id: Some(s.session_id),
    })
}

/// Refuses a message whose `role` Pi does not know (the model would never see it).
fn check_role(msg: &serde_json::Map<String, Value>) -> Result<(), Failure> {
    match msg.get("role") {
        Some(Value::String(r)) if pincer_pi::MESSAGE_ROLES.contains(&r.as_str()) => Ok(()),
        Some(Value::String(r)) => Err(Failure::usage(format!(
            "unknown role {r:?} in --message; a Pi message's role is one of {}; nothing written",
            pincer_pi::MESSAGE_ROLES.join(", ")
        ))),
        _ => Err(Failure::usage(format!(
            "--message needs a string `role` ({}); nothing written",
            pincer_pi::MESSAGE_ROLES.join(", ")
        ))),
    }
}

pub fn run(cmd: TranscriptCmd) -> Result<u8, Failure> {
    match cmd {
        TranscriptCmd::Context { target, leaf } => {
            let located = locate(target, Needs::Store)?;
            let session = located.read()?;
            let leaf = leaf.as_deref().map(LeafArg::parse).unwrap_or(LeafArg::Default);
            let report = context_report(&session, &leaf).map_err(|e| Failure::usage(format!("--leaf: {e}")))?;
            for w in &report.warnings {
                eprintln!("pincer: warning: {}: {w}", located.name);
            }
            // Messages are written as the raw JSON of the file: no re-encoding of large contexts.
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            report.write_json(&mut out).and_then(|_| out.flush()).map_err(|e| crate::out::write_failure(&e))?;
            // The process ends next and its memory with it: the index of a large file (100k+
            // entries, each holding shared key text) is not freed piece by piece first.
            std::mem::forget(report);
            std::mem::forget(session);
            Ok(0)
        }
        TranscriptCmd::Append { target, message, idempotency_key, session_id } => {
            let mut msg: Value = serde_json::from_str(&message)
                .map_err(|e| Failure::usage(format!("--message is not valid JSON: {e}")))?;
            let Some(obj) = msg.as_object_mut() else {
                return Err(Failure::usage("--message must be a JSON object (a Pi message with a `role`)"));
            };
            check_role(obj)?;
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
            let located = locate(target, Needs::All)?;
            let session_id = session_id.or(located.session_id.clone());
            let entry = NewEntry::message(msg);
            let a = match &located.configured {
                Some((db, _)) if located.in_database() => db.append_with(&located.path, entry, session_id.as_deref()),
                configured => {
                    let redactor = match configured {
                        Some((_, settings)) => settings.redactor().map_err(Failure::usage)?,
                        None => StoreOptions::default().redactor,
                    };
                    let store = Store::new(StoreOptions { redactor, ..StoreOptions::default() });
                    let a = store.append_with(&located.path, entry, session_id.as_deref());
                    store.close();
                    a
                }
            };
            let a = a.map_err(store_failure)?;
            print_json(&json!({"id": a.entry["id"], "parentId": a.entry["parentId"], "appended": a.appended}))?;
            Ok(0)
        }
        TranscriptCmd::Verify { target, json } => {
            let located = locate(target, Needs::Store)?;
            let file = located.file("verify")?;
            if !file.exists() {
                return Err(located.missing());
            }
            let report = pincer_store::verify::verify(file)
                .map_err(|e| Failure::usage(format!("cannot verify {}: {e}", located.name)))?;
            if json {
                print_json(&report.to_json())?;
            } else {
                crate::out::write(report.to_text().as_bytes())?;
            }
            Ok(if report.healthy() { 0 } else { 1 })
        }
        TranscriptCmd::Repair { target } => {
            let located = locate(target, Needs::Store)?;
            let file = located.file("repair")?;
            if !file.exists() {
                return Err(located.missing());
            }
            report_removed(pincer_store::files::remove_stale_temps_of(file));
            let store = Store::new(StoreOptions::default());
            let r = store.repair(file);
            store.close();
            let r = r.map_err(store_failure)?;
            let mut text = String::new();
            match &r.backup {
                None => text.push_str(&format!("{}: nothing to repair\n", file.display())),
                Some(b) => {
                    for p in &r.fixed {
                        text.push_str(&format!("fixed [{}] {}\n", p.kind(), p.message()));
                    }
                    text.push_str(&format!(
                        "{}: repaired; the previous version is kept as {}\n",
                        file.display(),
                        b.display()
                    ));
                }
            }
            for p in &r.remaining {
                text.push_str(&format!("still there [{}] {}\n", p.kind(), p.message()));
            }
            crate::out::write(text.as_bytes())?;
            Ok(if r.remaining.is_empty() { 0 } else { 1 })
        }
        TranscriptCmd::Compact { file, session, model, instructions, state_dir, config } => {
            let target = Target { file, session, config: config.clone(), state_dir: state_dir.clone() };
            let located = locate(target, Needs::All)?;
            let file = located.file("compact")?;
            if !file.exists() {
                return Err(located.missing());
            }
            compact(file, model, instructions, state_dir, config)
        }
        TranscriptCmd::Export { target, format, leaf, output } => {
            let default_format = if target.file.is_some() { "html" } else { "jsonl" };
            let located = locate(target, Needs::Store)?;
            let session = located.read()?;
            export(session, &located, format.as_deref().unwrap_or(default_format), leaf.as_deref(), output)
        }
        TranscriptCmd::Import { input, state_dir } => import(&input, state_dir),
        TranscriptCmd::History { target, limit, max_chars, output } => {
            if limit == 0 || limit > MAX_LIMIT {
                return Err(Failure::usage(format!("--limit must be between 1 and {MAX_LIMIT}")));
            }
            if max_chars == 0 {
                return Err(Failure::usage("--max-chars must be at least 1"));
            }
            let located = locate(target, Needs::Store)?;
            let opts = HistoryOptions { limit, max_chars, before: None };
            let h = match &located.configured {
                Some((db, _)) if located.in_database() => db.history(&located.path, opts).map_err(|e| e.to_string()),
                _ if !located.path.exists() => return Err(located.missing()),
                _ => read_history(&located.path, opts).map_err(|e| e.to_string()),
            }
            .map_err(|e| Failure::usage(format!("cannot read {}: {e}", located.name)))?;
            if output.json() {
                print_json(&json!({"sessionId": h.session_id, "messages": h.messages}))?;
            } else {
                crate::out::write(history_table(h.session_id.as_deref(), &h.messages).as_bytes())?;
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
    use pincer_gateway::config;
    let settings = config::load(&Overrides { offline: true, skip_providers: false, bind: None, state_dir, config })
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

fn export(
    session: Session,
    located: &Located,
    format: &str,
    leaf: Option<&str>,
    output: Option<PathBuf>,
) -> Result<u8, Failure> {
    let format = pincer_export::Format::parse(format)
        .ok_or_else(|| Failure::usage(format!("--format {format:?}: expected html, md or jsonl")))?;
    if session.header.is_none() {
        return Err(Failure::usage(format!(
            "no valid session header in {} (not a Pi session; `pincer transcript verify` says more)",
            located.name
        )));
    }
    if let Some(id) = leaf.filter(|l| *l != "null") {
        if !session.by_id.contains_key(id) {
            return Err(Failure::usage(format!("--leaf: unknown entry id {id:?} in {}", located.name)));
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
            if same_file(&out, &located.path) {
                return Err(Failure::usage(format!("--output {} is the transcript itself", out.display())));
            }
            pincer_store::files::write_export(&out, &bytes).map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => {
                    Failure::usage(format!("--output {} exists; nothing written (choose a new file)", out.display()))
                }
                _ => Failure::failed(format!("{}: cannot write: {e}", out.display())),
            })?;
        }
        None => crate::out::write(&bytes)?,
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

/// Says on stderr which temp files of killed writes were removed before a rewrite.
fn report_removed(removed: Vec<PathBuf>) {
    for p in removed {
        eprintln!("pincer: removed {}: a temp file an interrupted write left", p.display());
    }
}

fn import(input: &Path, state_dir: Option<PathBuf>) -> Result<u8, Failure> {
    let bytes = std::fs::read(input).map_err(|e| Failure::usage(format!("{}: cannot read: {e}", input.display())))?;
    let prepared =
        pincer_export::prepare_import(&bytes).map_err(|e| Failure::usage(format!("{}: {e}", input.display())))?;
    let dir = state_dir.unwrap_or_else(pincer_gateway::config::default_state_dir);
    report_removed(pincer_store::files::remove_stale_temps(&dir));
    let store = Store::new(StoreOptions::default());
    let sessions = pincer_gateway::sessions::Sessions::new(&dir, std::sync::Arc::new(store.clone()));
    let r = sessions.import(&prepared);
    store.close();
    let s = r.map_err(|e| Failure::failed(e.to_string()))?;
    print_json(&json!({"sessionKey": s.key, "sessionId": s.session_id, "file": s.path.display().to_string()}))?;
    Ok(0)
}
