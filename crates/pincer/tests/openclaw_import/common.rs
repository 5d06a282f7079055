//! What `openclaw_import.rs` and `openclaw_import_external.rs` share: running the import.

use serde_json::Value;
use std::path::Path;

pub const BIN: &str = env!("CARGO_BIN_EXE_pincer");

/// `pincer store import --from-openclaw <from> --state-dir <to> [--to <url>]`: its exit code and
/// JSON report.
pub fn import(from: &Path, to: &Path, url: Option<&str>) -> (Option<i32>, Value) {
    let out = std::process::Command::new(BIN)
        .args(["store", "import", "--from-openclaw"])
        .arg(from)
        .arg("--state-dir")
        .arg(to)
        .args(url.map(|u| ["--to", u]).into_iter().flatten())
        .env_remove("PINCER_DATABASE_URL")
        .output()
        .expect("run pincer");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), report)
}
