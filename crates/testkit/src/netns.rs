//! A test run again inside a fresh network namespace (as root, with iproute2's `ip`): only
//! loopback is up, with any extra addresses the test asks for on it — so a test can reach a local
//! server by an address outside 127/8 (a "public" one) without touching the machine's network.

use std::process::Command;

/// Set in the copy of a test that runs inside the namespace.
const INSIDE: &str = "PINCER_TEST_IN_NETNS";

/// True in the copy of a test running inside its namespace.
pub fn inside() -> bool {
    std::env::var_os(INSIDE).is_some()
}

/// Runs the calling test (`name`, its exact name as the test harness knows it) again inside a new
/// network namespace with loopback up and the CIDR addresses `extra` added to it, and asserts it
/// passed there. Returns true in that inner run (go on with the test), false in the outer one (done).
pub fn run_inside(name: &str, extra: &[&str]) -> bool {
    if inside() {
        return true;
    }
    // One namespace per test, also when several tests of one binary run at once.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ns = format!("pincer-t-{}-{n}", std::process::id());
    let ip = |args: &[&str]| {
        let out = Command::new("ip").args(args).output().expect("run ip (iproute2; the test runs as root)");
        assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ip(&["netns", "add", &ns]);
    struct Gone(String);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "delete", &self.0]).status();
        }
    }
    let _gone = Gone(ns.clone());
    ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"]);
    for addr in extra {
        ip(&["netns", "exec", &ns, "ip", "addr", "add", addr, "dev", "lo"]);
    }
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(exe)
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(INSIDE, "1")
        .output()
        .expect("run the test in the namespace");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("1 passed"), "{name} in {ns}:\n{stdout}\n{stderr}");
    // What the inner run printed (e.g. a TUI's pane), in the outer test's output.
    #[allow(clippy::print_stdout)]
    {
        println!("{stdout}");
    }
    false
}
