//! OpenClaw's own CLI (openclaw@2026.9.6 on Node 24, installed by `scripts/test` into
//! `tests/openclaw-cli`; and 2026.5.28 as a writer of state dirs) as a client of a test gateway, in a network namespace with loopback
//! alone: OpenClaw makes outbound lookups at run time, so a test runs itself again inside a fresh
//! namespace (fake provider, gateway and CLI all on that loopback) and the outer test checks it passed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The installed CLI: (node, openclaw.mjs). Panics naming the fix when it is missing (never skips).
pub fn cli() -> (PathBuf, PathBuf) {
    let dir = crate::repo_root().join("tests/openclaw-cli");
    let node = dir.join("node/node_modules/.bin/node");
    let entry = dir.join("node_modules/openclaw/openclaw.mjs");
    assert!(
        node.exists() && entry.exists(),
        "OpenClaw's CLI is not installed ({} / {}): run scripts/test, or `npm ci` in tests/openclaw-cli/node and then, \
         with that node on PATH, in tests/openclaw-cli",
        node.display(),
        entry.display()
    );
    (node, entry)
}

/// Runs the calling test (`name`, its exact name) again inside a new network namespace with only
/// loopback up, and asserts it passed there. Returns true in that inner run (go on with the test),
/// false in the outer one (done).
pub fn in_loopback_namespace(name: &str) -> bool {
    if crate::netns::inside() {
        return true;
    }
    cli();
    // One OpenClaw test at a time: each runs Node programs that load a 2-core machine on their own
    // (the suite's other timing-sensitive tests suffer when four run at once).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    crate::netns::run_inside(name, &[])
}

/// Runs `openclaw <args>` against the gateway at `addr` with `token`, with its home and state in `home`.
pub fn run(home: &Path, addr: &str, token: &str, args: &[&str]) -> Output {
    let (node, entry) = cli();
    command(&node, &entry, home)
        .args(args)
        .env("OPENCLAW_GATEWAY_URL", format!("ws://{addr}"))
        .env("OPENCLAW_GATEWAY_TOKEN", token)
        .output()
        .expect("run openclaw")
}

/// OpenClaw 2026.5.28 (the JSONL-era transcript code, installed by `scripts/test` into
/// `tests/openclaw-528`): `openclaw <args>` on its own, its home and state in `home`.
pub fn run_2026_5_28(home: &Path, args: &[&str]) -> Output {
    let (node, _) = cli();
    let entry = crate::repo_root().join("tests/openclaw-528/node_modules/openclaw/openclaw.mjs");
    assert!(entry.exists(), "OpenClaw 2026.5.28 is not installed ({}): run scripts/test", entry.display());
    command(&node, &entry, home).args(args).output().expect("run openclaw 2026.5.28")
}

/// `node <entry>` with a clean environment: `HOME` and the OpenClaw state under `home`.
fn command(node: &Path, entry: &Path, home: &Path) -> Command {
    std::fs::create_dir_all(home).expect("openclaw home");
    let mut c = Command::new(node);
    c.arg(entry)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("OPENCLAW_STATE_DIR", home.join(".openclaw"))
        .env("NO_COLOR", "1");
    c
}

/// `openclaw tui` in a detached tmux session of its own (a private tmux server), driven by
/// `send-keys` and read by `capture-pane`, as a person at a terminal would use it.
pub struct Tui {
    socket: String,
}

impl Tui {
    /// Starts the TUI against the gateway at `addr` on `session`, in a 120×40 pane.
    pub fn start(home: &Path, addr: &str, token: &str, session: &str) -> Tui {
        let (node, entry) = cli();
        std::fs::create_dir_all(home).expect("openclaw home");
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tui = Tui { socket: format!("pincer-tui-{}-{n}", std::process::id()) };
        let path = std::env::var("PATH").unwrap_or_default();
        let q = |p: &Path| format!("'{}'", p.display());
        // The pane's program gets a clean environment, as `run` gives the CLI.
        let command = format!(
            "env -i PATH='{path}' HOME={} OPENCLAW_STATE_DIR={} TERM=xterm-256color NO_COLOR=1 {} {} tui \
             --url ws://{addr} --token '{token}' --session '{session}'",
            q(home),
            q(&home.join(".openclaw")),
            q(&node),
            q(&entry)
        );
        tui.tmux(&["new-session", "-d", "-s", "tui", "-x", "120", "-y", "40", &command]);
        tui
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux (Debian's tmux; scripts/test installs it)");
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `keys` (tmux key names such as `Enter` and `Escape` are pressed, not typed).
    pub fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "tui"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    /// What the pane shows now.
    pub fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "tui"])
    }

    /// Waits until the pane shows `text`, and returns the screen; panics with the screen after 60 s.
    pub fn wait_for(&self, text: &str) -> String {
        self.wait_until(&format!("{text:?}"), |s| s.contains(text))
    }

    /// Waits until the screen satisfies `shows` (`what` names it), and returns the screen; panics
    /// with the screen after 60 s.
    pub fn wait_until(&self, what: &str, shows: impl Fn(&str) -> bool) -> String {
        let every = std::time::Duration::from_millis(100);
        crate::probe::poll(std::time::Duration::from_secs(60), every, || Some(self.screen()).filter(|s| shows(s)))
            .unwrap_or_else(|| panic!("the TUI never showed {what}; its screen:\n{}", self.screen()))
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).output();
    }
}
