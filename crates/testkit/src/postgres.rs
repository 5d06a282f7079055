//! A throwaway PostgreSQL cluster for tests: Debian's `postgresql` binaries (found under
//! `/usr/lib/postgresql/<version>/bin`, or `PINCER_PG_BIN`), `initdb` into a temp dir and `pg_ctl`
//! on a free loopback port, run as the unprivileged `postgres` user when the tests run as root
//! (`initdb` refuses root). [`Postgres::shared`] starts one cluster per test binary (each test
//! makes its own database in it with [`Postgres::database`]); a watchdog process stops it and
//! removes its directory when the test binary exits, however it exits. [`Postgres::start`] gives a
//! test a cluster of its own (for restarts), stopped on drop. No mock, nothing downloaded.

use crate::{free_port, next_id};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A running cluster.
pub struct Postgres {
    /// Data directory and socket directory (inside one temp dir).
    pub dir: PathBuf,
    pub port: u16,
    bin: PathBuf,
    owned: bool,
}

/// The directory holding `initdb`, `pg_ctl`, `createdb` (the newest version installed).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PINCER_PG_BIN") {
        return PathBuf::from(d);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, p)| p.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p).unwrap_or_else(|| {
        panic!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/<version>/bin/initdb): run scripts/test (it installs \
             Debian's postgresql package), or set PINCER_PG_BIN to the directory of initdb and pg_ctl"
        )
    })
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `program args…`, as the `postgres` user when running as root.
fn command(bin: &Path, program: &str) -> Command {
    let exe = bin.join(program);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(exe);
        c
    } else {
        Command::new(exe)
    }
}

fn run(mut c: Command, what: &str) {
    let out = c.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// An advisory lock a test holds ([`Postgres::hold_advisory_lock`]).
pub struct HeldLock {
    child: std::process::Child,
    tag: String,
}

impl Postgres {
    /// The test binary's cluster, started on first use.
    pub fn shared() -> &'static Postgres {
        static SHARED: OnceLock<Postgres> = OnceLock::new();
        SHARED.get_or_init(|| Postgres::init(false))
    }

    /// A cluster of the caller's own, stopped (and removed) on drop, or by the watchdog if this
    /// process ends without dropping it (a panic on another thread, a kill).
    pub fn start() -> Postgres {
        Postgres::init(true)
    }

    fn init(owned: bool) -> Postgres {
        let bin = bin_dir();
        let base = std::env::temp_dir().join(format!("pincer-pg-{}-{}", std::process::id(), next_id()));
        let dir = base.join("data");
        std::fs::create_dir_all(&dir).expect("pg dir");
        if is_root() {
            run(
                {
                    let mut c = Command::new("chown");
                    c.args(["-R", "postgres:postgres"]).arg(&base);
                    c
                },
                "chown the cluster directory",
            );
        }
        let mut c = command(&bin, "initdb");
        c.args(["-D"]).arg(&dir).args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--locale=C"]);
        run(c, "initdb");
        let pg = Postgres { dir, port: free_port(), bin, owned };
        pg.pg_start();
        pg.watch_parent();
        pg
    }

    /// Starts the server (again) on its port; waits until it accepts connections.
    pub fn pg_start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=32MB",
            self.port,
            self.socket_dir().display()
        );
        let mut c = command(&self.bin, "pg_ctl");
        c.arg("-D").arg(&self.dir).args(["-o", &opts, "-l"]).arg(self.dir.join("server.log")).args(["-w", "start"]);
        run(c, "pg_ctl start");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "PostgreSQL did not listen on port {}", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (fast mode: sessions are cut, as in a crash of the clients' connections).
    pub fn pg_stop(&self) {
        let mut c = command(&self.bin, "pg_ctl");
        c.arg("-D").arg(&self.dir).args(["-m", "fast", "-w", "stop"]);
        run(c, "pg_ctl stop");
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.parent().map(Path::to_path_buf).unwrap_or_else(|| self.dir.clone())
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates a new database (a fresh name each call) and returns its URL.
    pub fn database(&self, prefix: &str) -> String {
        let name = format!("{prefix}_{}_{}", std::process::id(), next_id());
        let mut c = command(&self.bin, "createdb");
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", &name]);
        run(c, "createdb");
        self.url(&name)
    }

    /// Runs `sql` with `psql` on the database of `url` (one of [`Postgres::database`]'s) and returns
    /// its unaligned output (`|` between columns, a line per row).
    pub fn psql(&self, url: &str, sql: &str) -> String {
        let db = url.rsplit('/').next().expect("database name");
        let mut c = command(&self.bin, "psql");
        c.args(["-X", "-At", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-d", db, "-c", sql]);
        let out = c.stdin(Stdio::null()).output().expect("psql");
        assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    }

    /// Holds advisory lock `key` on the database of `url` from a `psql` session of its own until
    /// [`Postgres::release`]; returns once the lock is held.
    pub fn hold_advisory_lock(&self, url: &str, key: i64) -> HeldLock {
        let db = url.rsplit('/').next().expect("database name");
        // One tag per hold: tests of one binary run at once, and `release` ends the sessions it names.
        static HOLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = HOLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("held-by-test-{}-{n}-end", std::process::id());
        let sql = format!("SELECT pg_advisory_lock({key}); SELECT pg_sleep(3600) /* {tag} */");
        let mut c = command(&self.bin, "psql");
        c.args(["-X", "-At", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-d", db, "-c", &sql]);
        let child = c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("psql");
        let held =
            format!("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%{tag}%' AND wait_event = 'PgSleep'");
        let q = |sql: &str| self.psql(url, sql);
        crate::probe::poll(std::time::Duration::from_secs(30), std::time::Duration::from_millis(20), || {
            (q(&held) == "1").then_some(())
        })
        .expect("the advisory lock was not taken within 30 s");
        HeldLock { child, tag }
    }

    /// Ends the session holding `lock` (its backend, which sleeps, and its `psql`).
    pub fn release(&self, url: &str, mut lock: HeldLock) {
        let end = format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE '%{}%' AND \
             wait_event = 'PgSleep'",
            lock.tag
        );
        assert_eq!(self.psql(url, &end), "1", "the lock's session was not there to end");
        let _ = lock.child.kill();
        let _ = lock.child.wait();
    }

    /// A process that stops the cluster and removes it once this test binary has exited.
    fn watch_parent(&self) {
        let pg_ctl = self.bin.join("pg_ctl");
        let as_user = if is_root() { "runuser -u postgres -- " } else { "" };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; {as_user}{pg_ctl} -D '{dir}' -m immediate -w stop \
             >/dev/null 2>&1; rm -rf '{base}'",
            pid = std::process::id(),
            pg_ctl = pg_ctl.display(),
            dir = self.dir.display(),
            base = self.socket_dir().display(),
        );
        // Not waited for: it outlives this process on purpose (init reaps it).
        #[allow(clippy::zombie_processes)]
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the cluster's watchdog");
    }
}

/// `<bin> store import --from <state_dir> --to <url>` (the `pincer` binary at `bin`): asserts it
/// succeeded and returns its JSON report.
pub fn import(bin: &Path, state_dir: &Path, url: &str) -> serde_json::Value {
    let out = Command::new(bin)
        .args(["store", "import", "--from"])
        .arg(state_dir)
        .args(["--to", url])
        .output()
        .expect("run pincer store import");
    assert!(out.status.success(), "pincer store import: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the import's report is JSON")
}

/// `n` `pincer gateway` processes (`bin`) with `config` (which names the database), state dirs
/// `<dir>/r<i>` and replica ids `replica-<i>`, returned once each replica's startup check of
/// interrupted turns is over (one still under way could take a turn a test kills a replica in).
pub fn start_replicas(bin: &str, dir: &Path, config: &str, n: usize) -> Vec<crate::gateway::GatewayProcess> {
    use crate::gateway::{GatewayProcess, StartOptions};
    let replicas: Vec<GatewayProcess> = (0..n)
        .map(|i| {
            let options =
                StartOptions { env: vec![("PINCER_REPLICA_ID".into(), format!("replica-{i}"))], ..Default::default() };
            GatewayProcess::start_with(bin, &dir.join(format!("r{i}")), config, &options)
        })
        .collect();
    for r in &replicas {
        crate::probe::poll(Duration::from_secs(30), Duration::from_millis(20), || {
            r.log_text().contains("startup check done").then_some(())
        })
        .expect("the startup check ends");
    }
    replicas
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.owned {
            let mut c = command(&self.bin, "pg_ctl");
            c.arg("-D").arg(&self.dir).args(["-m", "immediate", "-w", "stop"]);
            let _ = c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
            let _ = std::fs::remove_dir_all(self.socket_dir());
        }
    }
}
