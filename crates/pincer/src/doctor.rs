//! `pincer doctor`: checks what a gateway needs before it is started (or while it runs), one line
//! per check: the config file parses; each provider has its key and answers over HTTP; the
//! default model resolves; the hook's program exists and is executable; the state directory is a
//! writable directory; the store opens and its sessions can be listed. Reads only; exit 1 when a
//! check failed.

use crate::Failure;
use clap::Args;
use pincer_gateway::config::{self, Overrides, Settings, StoreSettings};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Args)]
pub struct DoctorArgs {
    /// State directory (default $PINCER_STATE_DIR or ~/.pincer).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Config file (default <state>/pincer.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// How long a provider has to answer.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
}

/// The lines printed so far, and whether one failed.
#[derive(Default)]
struct Checks {
    text: String,
    failed: bool,
}

impl Checks {
    fn ok(&mut self, what: &str, detail: impl AsRef<str>) {
        self.text.push_str(&format!("ok    {what}: {}\n", detail.as_ref()));
    }
    fn fail(&mut self, what: &str, detail: impl AsRef<str>) {
        self.failed = true;
        self.text.push_str(&format!("FAIL  {what}: {}\n", detail.as_ref()));
    }
    fn note(&mut self, what: &str, detail: impl AsRef<str>) {
        self.text.push_str(&format!("note  {what}: {}\n", detail.as_ref()));
    }
}

pub fn run(args: DoctorArgs) -> Result<u8, Failure> {
    let mut c = Checks::default();
    let overrides = |skip_providers| Overrides {
        offline: true,
        skip_providers,
        bind: None,
        state_dir: args.state_dir.clone(),
        config: args.config.clone(),
    };
    // Everything but the providers first, so that a missing key does not hide the rest.
    let settings = match config::load(&overrides(true)) {
        Ok(s) => s,
        Err(e) => {
            c.fail("config", e.to_string());
            crate::out::write(c.text.as_bytes())?;
            return Ok(1);
        }
    };
    let config_path = args.config.clone().unwrap_or_else(|| settings.state_dir.join("pincer.toml"));
    if config_path.is_file() {
        c.ok("config", config_path.display().to_string());
    } else {
        c.note("config", format!("{} does not exist; the defaults apply", config_path.display()));
    }
    match config::load(&overrides(false)) {
        Ok(full) => providers(&mut c, &full, Duration::from_millis(args.timeout_ms))?,
        Err(e) => c.fail("providers", e.to_string()),
    }
    hook(&mut c, &settings);
    state_dir(&mut c, &settings.state_dir);
    store(&mut c, &settings);
    crate::out::write(c.text.as_bytes())?;
    Ok(u8::from(c.failed))
}

fn providers(c: &mut Checks, settings: &Settings, timeout: Duration) -> Result<(), Failure> {
    let list = settings.providers.summaries();
    if list.is_empty() {
        c.note("providers", "none configured: the offline echo model pincer/echo answers");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::failed(format!("cannot start the runtime: {e}")))?;
    for (name, api, base_url, has_key) in list {
        let what = format!("provider {name}");
        let key = if has_key { "key set" } else { "no API key (fine for a local server)" };
        match runtime.block_on(settings.providers.probe(&name, timeout)) {
            Ok(status @ (401 | 403)) => {
                c.fail(&what, format!("{base_url} refused the key (HTTP {status}); {key}"));
            }
            Ok(status) => c.ok(&what, format!("{} at {base_url} answered (HTTP {status}); {key}", api.as_str())),
            Err(e) => c.fail(&what, format!("{base_url} is unreachable: {e}")),
        }
    }
    c.ok("model", format!("{} (the default)", settings.model));
    Ok(())
}

fn hook(c: &mut Checks, settings: &Settings) {
    let Some(h) = &settings.hook else { return };
    let Some(program) = h.command.first() else { return };
    match pincer_gateway::hook::find_program(program) {
        Ok(path) => c.ok("hook", format!("{} is executable", path.display())),
        Err(e) => c.fail("hook", format!("hooks.before_agent_run: {e}; the gateway refuses to start with it")),
    }
}

fn state_dir(c: &mut Checks, dir: &Path) {
    if !dir.exists() {
        c.note("state dir", format!("{} does not exist yet; `pincer gateway` creates it", dir.display()));
    } else if !dir.is_dir() {
        c.fail("state dir", format!("{} is not a directory", dir.display()));
    } else if rustix::fs::access(dir, rustix::fs::Access::WRITE_OK).is_err() {
        c.fail("state dir", format!("{} is not writable by this user", dir.display()));
    } else {
        c.ok("state dir", format!("{} (writable)", dir.display()));
    }
}

fn store(c: &mut Checks, settings: &Settings) {
    let kind = match &settings.store {
        StoreSettings::Jsonl => format!("JSONL files in {}", settings.state_dir.display()),
        StoreSettings::Postgres { .. } => "PostgreSQL".to_owned(),
    };
    let store = match pincer_gateway::state::open_transcripts(settings) {
        Ok(s) => s,
        Err(e) => return c.fail("store", format!("{kind}: {e}")),
    };
    let sessions = pincer_gateway::sessions::Sessions::new(&settings.state_dir, store);
    match sessions.list(None) {
        Ok(rows) => c.ok("store", format!("{kind}: {} session(s)", rows.len())),
        Err(e) => c.fail("store", format!("{kind}: cannot list the sessions: {e}")),
    }
}
