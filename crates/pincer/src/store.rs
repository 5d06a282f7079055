//! `pincer store import --from STATE_DIR --to postgres://…`: moves a JSONL state directory into a
//! PostgreSQL database. Every transcript (`agents/<agent>/sessions/*.jsonl`, and the archived
//! `*.jsonl.<reset|deleted|new>.<ts>`) keeps its bytes line for line (an old or linear file is
//! migrated first, as the file store would before its next append); every agent's
//! `sessions.json` becomes its index rows. Nothing already in the database is replaced: a
//! transcript there is skipped, index keys there are kept. The files are only read. Prints
//! `{"transcripts","skipped","sessions","problems"}`; exit 1 when a file could not be imported.

use crate::Failure;
use clap::{Args, Subcommand};
use pincer_pg::{redact_url, PgOptions, PgStore};
use pincer_store::Transcripts;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Subcommand)]
pub enum StoreCmd {
    /// Copy a JSONL state directory's transcripts and session indexes into PostgreSQL, or bring
    /// OpenClaw 2026.9's SQLite sessions into Pincer's store (`--from-openclaw`).
    Import(ImportArgs),
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["from", "from_openclaw"]))]
pub struct ImportArgs {
    /// The Pincer (JSONL) state directory to read (it is not modified).
    #[arg(long)]
    from: Option<PathBuf>,
    /// An OpenClaw 2026.9 state directory (sessions in agents/<agent>/agent/openclaw-agent.sqlite,
    /// opened read-only): its sessions are added to Pincer's store.
    #[arg(long, value_name = "STATE_DIR")]
    from_openclaw: Option<PathBuf>,
    /// The database: postgres://user:password@host:port/db (or PINCER_DATABASE_URL). Required with
    /// --from; with --from-openclaw, without it the JSONL state directory is written.
    #[arg(long, env = "PINCER_DATABASE_URL", hide_env_values = true)]
    to: Option<String>,
    /// With --from-openclaw: Pincer's state directory (default: ~/.pincer).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

pub fn run(cmd: StoreCmd) -> Result<u8, Failure> {
    match cmd {
        StoreCmd::Import(args) => match (&args.from, &args.from_openclaw, &args.to) {
            (Some(from), _, Some(to)) => import(from, to),
            (Some(_), _, None) => Err(Failure::usage("--from needs --to postgres://… (or PINCER_DATABASE_URL)")),
            (None, Some(from), to) => import_openclaw(from, to.as_deref(), args.state_dir),
            (None, None, _) => Err(Failure::usage("--from or --from-openclaw is required")),
        },
    }
}

/// `--from-openclaw`: into the JSONL state directory, or PostgreSQL when `to` names one.
fn import_openclaw(from: &Path, to: Option<&str>, state_dir: Option<PathBuf>) -> Result<u8, Failure> {
    let state_dir = state_dir.unwrap_or_else(pincer_gateway::config::default_state_dir);
    let redactor = pincer_store::StoreOptions::default().redactor;
    match to {
        None => {
            let store = pincer_store::Store::new(pincer_store::StoreOptions::default());
            let done = crate::openclaw::import(from, &store, &state_dir, redactor.as_ref());
            store.close();
            done
        }
        Some(url) => {
            let store = PgStore::connect(PgOptions {
                url: url.to_owned(),
                pool_size: 4,
                state_dir: state_dir.clone(),
                redactor: Arc::new(pincer_store::redact::NoRedaction),
                cwd: String::new(),
            })
            .map_err(|e| Failure::failed(format!("--to {}: {e}", redact_url(url))))?;
            crate::openclaw::import(from, &store, &state_dir, redactor.as_ref())
        }
    }
}

/// An archived transcript's name: `<id>.jsonl.<reason>.<ts>`.
fn is_archive(name: &str) -> bool {
    name.split_once(".jsonl.").is_some_and(|(_, rest)| {
        rest.split_once('.').is_some_and(|(reason, ts)| matches!(reason, "reset" | "deleted" | "new") && !ts.is_empty())
    })
}

fn import(from: &Path, url: &str) -> Result<u8, Failure> {
    let agents_dir = from.join("agents");
    if !agents_dir.is_dir() {
        return Err(Failure::usage(format!(
            "--from {}: no agents/ directory (not a Pincer state directory)",
            from.display()
        )));
    }
    let store = PgStore::connect(PgOptions {
        url: url.to_owned(),
        pool_size: 4,
        state_dir: from.to_path_buf(),
        // The bytes go over as they are: they were redacted when they were written.
        redactor: Arc::new(pincer_store::redact::NoRedaction),
        cwd: String::new(),
    })
    .map_err(|e| Failure::failed(format!("--to {}: {e}", redact_url(url))))?;
    let (mut transcripts, mut skipped, mut sessions) = (0usize, 0usize, 0usize);
    let mut problems: Vec<String> = Vec::new();
    let mut agents: Vec<PathBuf> = std::fs::read_dir(&agents_dir)
        .map_err(|e| Failure::usage(format!("{}: {e}", agents_dir.display())))?
        .flatten()
        .map(|e| e.path().join("sessions"))
        .filter(|p| p.is_dir())
        .collect();
    agents.sort();
    for dir in agents {
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.path()).collect();
        files.sort();
        for path in files {
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            if !(name.ends_with(".jsonl") || is_archive(name)) {
                continue;
            }
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    problems.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            match store.import_bytes(&path, &bytes) {
                Ok(true) => transcripts += 1,
                Ok(false) => skipped += 1,
                Err(e) => problems.push(format!("{}: {e}", path.display())),
            }
        }
        let index = dir.join("sessions.json");
        if index.is_file() {
            match import_index(&store, &index) {
                Ok(n) => sessions += n,
                Err(e) => problems.push(format!("{}: {e}", index.display())),
            }
        }
    }
    let report = json!({"transcripts": transcripts, "skipped": skipped, "sessions": sessions, "problems": problems});
    crate::out::line(&report.to_string())?;
    Ok(if problems.is_empty() { 0 } else { 1 })
}

/// Adds an agent's index rows the database does not have yet; returns how many.
fn import_index(store: &PgStore, index: &Path) -> Result<usize, String> {
    let bytes = std::fs::read(index).map_err(|e| e.to_string())?;
    let Ok(Value::Object(file_map)) = serde_json::from_slice::<Value>(&bytes) else {
        return Err("not a JSON object".into());
    };
    let mut map: Map<String, Value> = match store.read_index(index).map_err(|e| e.to_string())? {
        Some(b) => serde_json::from_slice(&b).map_err(|e| e.to_string())?,
        None => Map::new(),
    };
    let mut added = 0;
    for (key, mut entry) in file_map {
        if map.contains_key(&key) {
            continue;
        }
        // A transcript path of this machine means nothing to the others: keep its file name only.
        if let Some(Value::String(f)) = entry.get_mut("sessionFile") {
            if let Some(name) = Path::new(f.as_str()).file_name().and_then(|n| n.to_str()) {
                *f = name.to_owned();
            }
        }
        map.insert(key, entry);
        added += 1;
    }
    let out = serde_json::to_vec(&map).map_err(|e| e.to_string())?;
    store.write_index(index, &out).map_err(|e| e.to_string())?;
    Ok(added)
}

#[cfg(test)]
mod tests {
    #[test]
    fn archive_names() {
        assert!(super::is_archive("a.jsonl.reset.2026-01-01T00-00-00.000Z"));
        assert!(!super::is_archive("a.jsonl.bak.2026"));
        assert!(!super::is_archive("a.jsonl.lock"));
    }
}
