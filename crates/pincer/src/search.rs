//! `pincer sessions search` and `pincer sessions reindex`: the full-text index of a state
//! directory (`pincer_search`), brought up to date with the transcripts before each search (only
//! what was appended since is read), and rebuilt from them on request. With `--config` naming
//! the PostgreSQL store, the search runs over the database (always up to date: there is nothing
//! to reindex).

use crate::Failure;
use clap::Args;
use pincer_gateway::search::{SearchParams, DEFAULT_LIMIT};
use pincer_gateway::sessions::AgentId;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(Args)]
pub struct SearchArgs {
    /// Words (all must match), "quoted phrases", prefix* (on a word or a phrase).
    query: String,
    /// State directory (default $PINCER_STATE_DIR or ~/.pincer).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Most hits.
    #[arg(long, default_value_t = DEFAULT_LIMIT)]
    limit: usize,
    /// Include archived sessions.
    #[arg(long)]
    archived: bool,
    /// Only this agent's sessions.
    #[arg(long)]
    agent: Option<String>,
    /// pincer.toml naming the store to search (its `[store]`: the JSONL state dir, or PostgreSQL).
    #[arg(long)]
    config: Option<PathBuf>,
    #[command(flatten)]
    output: crate::table::OutputArgs,
}

#[derive(Args)]
pub struct ReindexArgs {
    /// State directory (default $PINCER_STATE_DIR or ~/.pincer).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

fn open(dir: &std::path::Path) -> Result<pincer_search::Index, Failure> {
    if !dir.is_dir() {
        return Err(Failure::usage(format!("no such state directory: {}", dir.display())));
    }
    pincer_search::Index::open(dir).map_err(|e| Failure::failed(e.to_string()))
}

pub fn search(args: SearchArgs) -> Result<u8, Failure> {
    use pincer_gateway::search::SearchIndex;
    let agent_id = args.agent.as_deref().map(AgentId::parse).transpose().map_err(|e| Failure::usage(e.to_string()))?;
    let params = SearchParams {
        query: args.query,
        agent_id,
        limit: Some(args.limit),
        include_archived: Some(args.archived),
        ..SearchParams::default()
    };
    let (dir, store, pg) = match args.config {
        None => {
            let dir = args.state_dir.unwrap_or_else(pincer_gateway::config::default_state_dir);
            let store: std::sync::Arc<dyn pincer_store::Transcripts> =
                std::sync::Arc::new(pincer_store::Store::new(Default::default()));
            (dir, store, None)
        }
        Some(config) => {
            let settings = pincer_gateway::config::load(&pincer_gateway::config::Overrides {
                offline: true,
                skip_providers: true,
                bind: None,
                state_dir: args.state_dir,
                config: Some(config),
            })
            .map_err(|e| Failure::usage(e.to_string()))?;
            let (store, pg) =
                pincer_gateway::state::open_configured(&settings).map_err(|e| Failure::failed(e.to_string()))?;
            (settings.state_dir, store, pg)
        }
    };
    let sessions = pincer_gateway::sessions::Sessions::new(&dir, store);
    let found = match &pg {
        Some(pg) => pincer_gateway::search::search(&sessions, SearchIndex::Postgres(pg), &params),
        None => {
            let mut index = open(&dir)?;
            index.sync_all().map_err(|e| Failure::failed(e.to_string()))?;
            pincer_gateway::search::search(&sessions, SearchIndex::Sqlite(&index), &params)
        }
    }
    .map_err(|e| Failure::usage(e.message))?;
    let hits = found["results"].as_array().cloned().unwrap_or_default();
    if args.output.json() {
        let rows: Vec<Value> = hits
            .iter()
            .map(|h| {
                json!({"sessionKey": h["sessionKey"], "sessionId": h["sessionId"], "entryId": h["entryId"],
                    "snippet": h["snippet"], "title": h["title"], "role": h["role"], "timestamp": h["timestamp"]})
            })
            .collect();
        crate::out::json_pretty(&Value::Array(rows))?;
    } else if hits.is_empty() {
        crate::out::line(&format!("no matches in {}", dir.display()))?;
    } else {
        use crate::table::{local_time, one_line, Table};
        let mut t = Table::new(&["SESSION", "TITLE", "TIME", "ENTRY", "SNIPPET"]).flex(4);
        for h in &hits {
            let s = |k: &str| h[k].as_str().unwrap_or("-").to_owned();
            t.row(vec![
                s("sessionKey"),
                one_line(h["title"].as_str().unwrap_or("-"), 32),
                local_time(h["timestamp"].as_i64()),
                s("entryId"),
                one_line(&s("snippet"), 80),
            ]);
        }
        crate::out::write(t.render().as_bytes())?;
    }
    Ok(0)
}

pub fn reindex(args: ReindexArgs) -> Result<u8, Failure> {
    let dir = args.state_dir.unwrap_or_else(pincer_gateway::config::default_state_dir);
    let started = std::time::Instant::now();
    let mut index = open(&dir)?;
    let done = index.rebuild().map_err(|e| Failure::failed(e.to_string()))?;
    let ms = started.elapsed().as_millis() as u64;
    crate::out::line(
        &json!({"files": done.files, "messages": done.messages, "ms": ms, "index": pincer_search::db_path(&dir).display().to_string()})
            .to_string(),
    )?;
    Ok(0)
}
