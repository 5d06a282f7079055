//! The README cannot drift from the code: every fenced block of it is exercised here. Each ```toml
//! block is a whole `pincer.toml` that the gateway loads (`pincer gateway --print-url`, which loads
//! the config, builds the providers and resolves the model, then exits); the `pincer` commands of
//! the ```bash blocks are parsed by the binary (their synopsis brackets resolved to the first
//! choice), and the quick-start ones that start the gateway run with `--print-url` in their
//! environment; the `curl` commands run against a gateway; paths into the repository must exist;
//! the hook script runs as the hook of a gateway's turn. The deploy files' commands are parsed too.
//! The SDK snippets run in `readme_external.rs` (they need the official SDKs).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_testkit::gateway::{Client, GatewayProcess, TOKEN};
use serde_json::json;
use std::process::{Command, Output};

#[path = "readme/common.rs"]
mod common;
use common::*;

/// A shell line split into words (quotes and backslashes as the shell takes them; `#` starting a
/// word ends the line).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                w.extend(chars.by_ref().take_while(|&c| c != '\''));
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => w.extend(chars.next()),
                        c => w.push(c),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            '#' if word.is_none() => break,
            c if c.is_whitespace() => out.extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// The commands of a bash block: continuation lines joined, `&&` and a trailing `&` split off.
fn commands(block: &str) -> Vec<Vec<String>> {
    let joined = block.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let mut cmd = Vec::new();
        for w in words(line) {
            if w == "&&" || w == "&" || w == ";" {
                out.extend((!cmd.is_empty()).then(|| std::mem::take(&mut cmd)));
            } else {
                cmd.push(w);
            }
        }
        out.extend((!cmd.is_empty()).then_some(cmd));
    }
    out
}

/// A synopsis's optional parts taken, each with its first choice (`[--json|--table]` → `--json`,
/// `[--format html|md|jsonl]` → `--format html`), and a number for `N`.
fn first_choices(args: &[String]) -> Vec<String> {
    args.iter()
        .map(|a| a.trim_start_matches('[').trim_end_matches(']'))
        .map(|a| if a.starts_with('{') { a } else { a.split('|').next().unwrap_or(a) })
        .map(|a| if a == "N" { "10" } else { a })
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

fn pincer(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("PINCER_MODEL")
        .env_remove("PINCER_STATE_DIR")
        .env_remove("PINCER_OPENAI_API")
        .env("PINCER_GATEWAY_TOKEN", TOKEN);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[test]
fn the_readme_leads_with_its_two_commands_and_they_are_true() {
    let first = blocks(&readme()).into_iter().next().expect("a first block");
    assert_eq!(first.0, "bash");
    let cmds = commands(&first.1);
    assert_eq!(cmds.len(), 3, "{cmds:?}");
    assert_eq!(cmds[0], ["cargo", "run", "-p", "pincer", "--release", "--", "gateway"]);
    assert_eq!(cmds[1], ["scripts/test"]);
    // Then the fast tier, an option the script knows (its usage, for an option it does not, names it).
    assert_eq!(cmds[2], ["scripts/test", "--quick"]);
    let script = repo().join("scripts/test");
    use std::os::unix::fs::PermissionsExt;
    assert!(script.metadata().unwrap().permissions().mode() & 0o111 != 0, "scripts/test is not executable");
    let usage = Command::new(&script).arg("--no-such-option").output().unwrap();
    let stderr = String::from_utf8_lossy(&usage.stderr);
    assert!(usage.status.code() == Some(2) && stderr.contains("[--quick]"), "scripts/test: {stderr}");
    // `gateway` is a command of this binary, and its default address is the one the comment gives.
    ok(&pincer(&["gateway", "--help"], &[]), "pincer gateway --help");
    let dir = tempfile::tempdir().unwrap();
    let url = ok(&pincer(&["gateway", "--print-url", "--state-dir", dir.path().to_str().unwrap()], &[]), "print-url");
    assert!(first.1.contains("http://127.0.0.1:18789") && url.starts_with("http://127.0.0.1:18789/"), "{url}");
}

#[test]
fn every_config_block_is_a_pincer_toml_the_gateway_loads() {
    let tomls = of_lang("toml");
    assert!(tomls.len() >= 8, "{} toml blocks", tomls.len());
    for toml in &tomls {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("pincer.toml");
        std::fs::write(&config, toml).unwrap();
        // The keys a block reads from the environment, set to a placeholder; nothing else.
        let vars: Vec<String> = toml
            .lines()
            .filter_map(|l| l.trim().split_once('='))
            .filter(|(k, _)| k.trim().ends_with("_env") && !k.contains("pass"))
            .map(|(_, rest)| words(rest.trim())[0].clone())
            .collect();
        let envs: Vec<(&str, &str)> = vars.iter().map(|v| (v.as_str(), "sk-readme-placeholder-key")).collect();
        let state = dir.path().join("state");
        let args =
            ["gateway", "--print-url", "--state-dir", state.to_str().unwrap(), "--config", config.to_str().unwrap()];
        ok(&pincer(&args, &envs), &format!("loading\n{toml}"));
        // A hook is shown on its own, never at the end of a sample someone pastes whole.
        if toml.contains("[hooks.") {
            assert!(
                toml.trim_start().starts_with("[hooks.before_agent_run]"),
                "a hook inside a larger sample:\n{toml}"
            );
        }
    }
    // A sample per provider kind; the local servers need no key.
    for (kind, marker) in [
        ("Ollama", "127.0.0.1:11434"),
        ("OpenAI", "https://api.openai.com/v1"),
        ("Anthropic", "anthropic-messages"),
        ("llama.cpp", "127.0.0.1:8080"),
    ] {
        let sample = tomls.iter().find(|t| t.contains(marker)).unwrap_or_else(|| panic!("no {kind} sample"));
        assert!(sample.contains("[agents.defaults]"), "the {kind} sample picks no model:\n{sample}");
        if marker.starts_with("127.0.0.1") {
            assert!(!sample.contains("api_key"), "the {kind} sample needs no key:\n{sample}");
        }
    }
}

/// The programs a README command may run besides `pincer`, `curl` and the repository's scripts:
/// other people's tools, whose commands are not run here (their paths into the repo are checked).
const OTHERS: [&str; 11] =
    ["docker", "sudo", "systemctl", "journalctl", "export", "ollama", "llama-server", "pip", "npm", "eval", "cat"];

/// `VAR=value` pairs a command line sets.
type Env = Vec<(String, String)>;

/// The `pincer` arguments of a command, if it runs pincer (after `VAR=value`s, `sudo -u USER`,
/// `docker exec NAME`, `cargo run … --`).
fn pincer_args(cmd: &[String]) -> Option<(Env, Vec<String>)> {
    let mut envs = Vec::new();
    let mut rest = cmd;
    while let Some((first, tail)) = rest.split_first() {
        match first.split_once('=') {
            Some((k, v)) if !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_') => {
                envs.push((k.to_owned(), v.to_owned()));
                rest = tail;
            }
            _ => break,
        }
    }
    let rest: Vec<String> = match rest {
        [s, u, _user, tail @ ..] if s == "sudo" && u == "-u" => tail.to_vec(),
        [d, e, _name, tail @ ..] if d == "docker" && e == "exec" => tail.to_vec(),
        [c, r, tail @ ..] if c == "cargo" && r == "run" => std::iter::once("pincer".to_owned())
            .chain(tail.iter().skip_while(|a| *a != "--").skip(1).cloned())
            .collect(),
        other => other.to_vec(),
    };
    match rest.split_first() {
        Some((p, args)) if p == "pincer" => Some((envs, args.to_vec())),
        _ => None,
    }
}

#[test]
fn every_command_parses_and_the_quick_start_runs() {
    let bash = of_lang("bash");
    let dir = tempfile::tempdir().unwrap();
    let (mut parsed, mut started) = (0, 0);
    let mut curls = Vec::new();
    for block in &bash {
        for cmd in commands(block) {
            // Paths into the repository exist.
            for w in &cmd {
                if ["deploy/", "crates/", "scripts/", "docs/", "tests/"].iter().any(|p| w.starts_with(p)) {
                    assert!(repo().join(w).exists(), "{w} (in {cmd:?}) does not exist");
                }
            }
            if let Some((envs, args)) = pincer_args(&cmd) {
                let args = first_choices(&args);
                let mut help: Vec<&str> = args.iter().map(String::as_str).collect();
                help.push("--help");
                ok(&pincer(&help, &[]), &format!("pincer {args:?}"));
                parsed += 1;
                // The quick start: `pincer gateway` with the environment shown loads and resolves its model.
                if args == ["gateway"] && !envs.is_empty() {
                    let state = dir.path().join(format!("s{started}"));
                    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    ok(
                        &pincer(&["gateway", "--print-url", "--state-dir", state.to_str().unwrap()], &envs),
                        &format!("{cmd:?}"),
                    );
                    started += 1;
                }
                continue;
            }
            let program = cmd[0].as_str();
            match program {
                "curl" => curls.push(block.lines().find(|l| l.starts_with("curl")).unwrap().to_owned()),
                "cargo" => assert_eq!(cmd, ["cargo", "install", "--path", "crates/pincer", "--locked"]),
                "scripts/test" => {}
                p if OTHERS.contains(&p) => {}
                p if p.starts_with('#') => {}
                p => panic!("the README runs {p:?} ({cmd:?}): exercise it here, or list it as another's tool"),
            }
        }
    }
    assert!(parsed >= 20 && started >= 2, "{parsed} pincer commands, {started} quick starts");
    // The curl commands, against a gateway whose state dir is ~/.pincer.
    let home = tempfile::tempdir().unwrap();
    let state = home.path().join(".pincer");
    let gw = GatewayProcess::start(BIN, &state, "");
    std::fs::write(state.join("gateway.token"), TOKEN).unwrap();
    assert!(!curls.is_empty());
    for line in curls {
        let line = line.replace("127.0.0.1:18789", &gw.addr);
        let out = Command::new("sh").arg("-c").arg(&line).env("HOME", home.path()).output().unwrap();
        let text = ok(&out, &line);
        assert!(text.contains("pincer_turns_total{status=\"ok\"} 0"), "{line}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hook_script_allows_a_turn_as_the_hook_of_a_gateway() {
    let script = of_lang("sh").into_iter().find(|s| s.contains("outcome")).expect("the hook script");
    let hook = of_lang("toml").into_iter().find(|t| t.contains("[hooks.before_agent_run]")).expect("the hook block");
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("my-policy");
    std::fs::write(&program, &script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = hook.replace("/usr/local/bin/my-policy", program.to_str().unwrap());
    assert_ne!(config, hook, "the hook block runs the script's program");
    let gw = tokio::task::spawn_blocking({
        let state = dir.path().join("state");
        move || GatewayProcess::start(BIN, &state, &config)
    })
    .await
    .unwrap();
    let mut c = Client::connect(&gw.addr).await;
    c.request("chat.send", json!({"sessionKey": "main", "message": "let me through", "idempotencyKey": "h-1"}))
        .await
        .unwrap();
    let fin = c.chat_end("h-1").await;
    assert_eq!(fin["payload"]["state"], "final", "{fin}");
    let reply = pincer_testkit::probe::message_text(&fin["payload"]["message"]);
    assert!(reply.contains("let me through") && !reply.contains("blocked"), "{reply}");
}

#[test]
fn the_deploy_files_run_commands_the_binary_takes() {
    let unit = std::fs::read_to_string(repo().join("deploy/pincer.service")).unwrap();
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let args = words(exec);
    assert_eq!(args[0], "/usr/local/bin/pincer");
    let mut help: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    help.push("--help");
    ok(&pincer(&help, &[]), exec);
    let docker = std::fs::read_to_string(repo().join("deploy/Dockerfile")).unwrap();
    let cmd: Vec<String> =
        docker.lines().find_map(|l| l.strip_prefix("CMD ")).map(|c| serde_json::from_str(c).unwrap()).expect("CMD");
    let mut help: Vec<&str> = cmd.iter().map(String::as_str).collect();
    help.push("--help");
    ok(&pincer(&help, &[]), "the Dockerfile's CMD");
    assert!(docker.contains("cargo build --release --locked -p pincer"), "{docker}");
    let license = std::fs::read_to_string(repo().join("LICENSE")).unwrap();
    assert!(license.starts_with("MIT License"), "Cargo.toml says MIT");
}
