//! Test support shared by Pincer's crates: where `shared/` is, the real Pi library (the oracle) run
//! over a session file by one Node process per test binary ([`oracle`]), the fake model provider
//! every test uses ([`fake_provider`]: the three wire formats, scripted replies and faults; its
//! marker-driven OpenAI preset for the gateway, [`fake_openai`]), a fake Telegram Bot API
//! ([`fake_telegram`]), the gateway as a real process with a protocol client ([`gateway`]), probes of a running process and its state dir
//! ([`probe`]: memory, descriptors, raw sockets, transcripts, polling with a deadline), and OpenClaw's
//! own CLI in a loopback-only network namespace ([`openclaw`], through [`netns`]), a generated state directory
//! with known search hits ([`corpus`]), a throwaway PostgreSQL cluster ([`postgres`]), and the
//! transcript shapes of the hostile-input tests ([`shapes`]), Pi's context in OpenAI's wire form
//! ([`wire`]), the redaction of run-to-run values in wire snapshots ([`redact`]), a web server for
//! `web_fetch` ([`web`]), a proxy that makes a client read late ([`late_reader`]), and a throwaway
//! Matrix homeserver (Synapse) with a Matrix user client ([`synapse`]).
//!
//! The oracle is the `shared/pi-oracle` harness installed with `npm ci` into a writable copy; the
//! test scripts (`scripts/test`, `.ci/run`) do that and export `PINCER_PI_ORACLE`. Tests that need it
//! fail with instructions when it is missing: they are never skipped.

// Test support fails loudly: a panic here is a failed test with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod corpus;
pub mod fake_openai;
pub mod fake_provider;
pub mod fake_telegram;
pub mod gateway;
pub mod late_reader;
pub mod netns;
pub mod openclaw;
pub mod oracle;
pub mod postgres;
pub mod probe;
pub mod redact;
pub mod shapes;
pub mod synapse;
pub mod web;
pub mod wire;

use serde_json::Value;
use std::path::{Path, PathBuf};

/// A TCP port on loopback that was free a moment ago (for a server a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// A number unique in this process (for the names of throwaway directories and databases).
pub fn next_id() -> u32 {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python interpreter of a venv with the official `openai` package (`PINCER_OPENAI_PYTHON`,
/// else `target/openai-sdk-venv`, which scripts/test makes from tests/openai-sdk/requirements.txt).
pub fn sdk_python() -> PathBuf {
    let p = std::env::var_os("PINCER_OPENAI_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/openai-sdk-venv/bin/python"));
    assert!(
        p.is_file(),
        "the Python openai SDK is not installed at {}: run scripts/test (it makes the venv from tests/openai-sdk/requirements.txt), or set PINCER_OPENAI_PYTHON",
        p.display()
    );
    p
}

/// `tests/openai-sdk`, where npm's `openai` package is installed (scripts/test runs `npm ci` there);
/// a script in it imports the package.
pub fn sdk_dir() -> PathBuf {
    let d = repo_root().join("tests/openai-sdk");
    assert!(
        d.join("node_modules/openai/package.json").is_file(),
        "the npm openai SDK is not installed in {}: run scripts/test (npm ci there)",
        d.display()
    );
    d
}

/// The official SDKs' scripts `name` in [`sdk_dir`] (`<name>.py` with [`sdk_python`], `<name>.mjs`
/// with node), each with its prefix (`python`, `node`) for the texts it sends: for [`sdk_report`].
pub fn sdk_scripts(name: &str) -> [(&'static str, String, PathBuf); 2] {
    let (python, dir) = (sdk_python(), sdk_dir());
    [
        ("python", python.display().to_string(), dir.join(format!("{name}.py"))),
        ("node", "node".to_owned(), dir.join(format!("{name}.mjs"))),
    ]
}

/// Runs SDK script `script` with `program` against the OpenAI endpoint of the gateway at `addr`
/// (texts prefixed `prefix`); the JSON report it printed last. Panics with its output if it failed.
pub async fn sdk_report(addr: &str, prefix: &str, program: &str, script: &Path) -> serde_json::Value {
    let run = tokio::process::Command::new(program)
        .arg(script)
        .current_dir(sdk_dir())
        .env("PINCER_OPENAI_BASE_URL", format!("http://{addr}/v1"))
        .env("PINCER_TOKEN", gateway::TOKEN)
        .env("PINCER_PREFIX", prefix)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{prefix} SDK: {stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let last = stdout.lines().last().unwrap_or_else(|| panic!("{prefix} SDK printed no report"));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{prefix} SDK report {last:?}: {e}"))
}

/// `tests/mcp/node_modules/@modelcontextprotocol`: the MCP reference servers and the conformance
/// suite (scripts/test runs `npm ci` in tests/mcp from its lock).
pub fn mcp_servers_dir() -> PathBuf {
    let d = repo_root().join("tests/mcp/node_modules/@modelcontextprotocol");
    assert!(
        ["server-everything", "server-filesystem", "conformance"]
            .iter()
            .all(|p| d.join(p).join("dist/index.js").is_file()),
        "the MCP reference servers are not installed in {}: run scripts/test (npm ci in tests/mcp)",
        d.display()
    );
    d
}

/// The Codex CLI (npm `@openai/codex`, pinned in tests/codex; scripts/test runs `npm ci` there).
pub fn codex_bin() -> PathBuf {
    let p = repo_root().join("tests/codex/node_modules/.bin/codex");
    assert!(p.is_file(), "the Codex CLI is not installed at {}: run scripts/test (npm ci in tests/codex)", p.display());
    p
}

/// `shared/` (beside the repository, or `PINCER_SHARED_DIR`).
pub fn shared_dir() -> PathBuf {
    std::env::var_os("PINCER_SHARED_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("../shared"))
}

/// The Pi fixtures.
pub fn fixtures_dir() -> PathBuf {
    shared_dir().join("pi-oracle/fixtures")
}

/// The installed oracle (`PINCER_PI_ORACLE`, else `target/pi-oracle`).
pub fn oracle_dir() -> PathBuf {
    let dir =
        std::env::var_os("PINCER_PI_ORACLE").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target/pi-oracle"));
    assert!(
        dir.join("node_modules/@mariozechner/pi-coding-agent").is_dir(),
        "the Pi oracle is not installed at {}: run scripts/test (it copies shared/pi-oracle there and runs npm ci), \
         or set PINCER_PI_ORACLE to an installed copy",
        dir.display()
    );
    dir
}

/// Runs the real Pi library's `context.mjs` logic on `file` (optionally at `leaf`) and returns its
/// JSON output (`{"error": …}` when Pi fails), through the test binary's one oracle process
/// ([`oracle`]).
pub fn oracle_context(file: &Path, leaf: Option<&str>) -> Value {
    oracle::context(file, leaf)
}

/// Runs the real Pi library's `prepare.mjs` logic (compaction preparation, no model call) on
/// `file` (optionally at `leaf`) with `keepRecentTokens`/`reserveTokens`, and returns its JSON.
pub fn oracle_prepare(file: &Path, leaf: Option<&str>, keep: u64, reserve: u64) -> Value {
    oracle::prepare(file, leaf, keep, reserve)
}

/// The keys `pincer transcript context` shares with the oracle.
pub fn comparable(v: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for k in ["sessionId", "leafId", "entries", "context"] {
        if let Some(x) = v.get(k) {
            out.insert(k.into(), x.clone());
        }
    }
    Value::Object(out)
}
