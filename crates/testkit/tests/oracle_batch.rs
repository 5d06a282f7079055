//! The batch oracle (`oracle/batch.mjs`, one Node process for many requests) prints exactly what
//! the oracle's own scripts print. Every context leaf and compaction preparation of the oracle's
//! manifest is compared byte for byte with the fixture's stored output of `context.mjs` /
//! `prepare.mjs` (after removing the fields the manifest marks nondeterministic, such as the random
//! id of a headerless file), exit codes included; and a few cases run the scripts themselves, one
//! Node process each, to compare with them directly (all of them that way would cost a Node start
//! and library import per case, ~2 s of CPU each, which is what the batch mode saves).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_testkit::oracle::{self, Printed};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// `node SCRIPT ARGS…` started (all of them run at once, then are awaited).
fn spawn_script(script: &str, args: &[String]) -> Child {
    let path = oracle_dir().join(script);
    // The scripts only run when argv[1] is their real path (they compare it with import.meta.url).
    Command::new("node")
        .arg(std::fs::canonicalize(&path).unwrap_or(path))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node")
}

fn finish(child: Child) -> Printed {
    let out = child.wait_with_output().expect("node output");
    Printed { stdout: String::from_utf8(out.stdout).expect("utf-8"), code: out.status.code().unwrap_or(-1) }
}

fn oracle_dir() -> PathBuf {
    pincer_testkit::oracle_dir()
}

/// Removes `a.b.c` paths, as the oracle's check.mjs does.
fn strip(text: &str, paths: &[String]) -> Value {
    let mut v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    for p in paths {
        let parts: Vec<&str> = p.split('.').collect();
        let mut cur = &mut v;
        for k in &parts[..parts.len() - 1] {
            cur = &mut cur[*k];
        }
        if let Some(o) = cur.as_object_mut() {
            o.remove(parts[parts.len() - 1]);
        }
    }
    v
}

fn leaf_of(v: &Value) -> Option<String> {
    v["leaf"].as_str().filter(|l| !l.starts_with('(')).map(str::to_owned)
}

fn same(what: &str, nondeterministic: &[String], batch: &Printed, want: &Printed) {
    assert_eq!(batch.code, want.code, "{what}: exit code");
    if nondeterministic.is_empty() {
        assert_eq!(batch.stdout, want.stdout, "{what}");
    } else {
        assert_eq!(strip(&batch.stdout, nondeterministic), strip(&want.stdout, nondeterministic), "{what}");
    }
}

#[test]
fn batch_output_is_byte_identical_to_every_stored_fixture_output() {
    let dir = oracle_dir().join("fixtures");
    let manifest: Value = serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let (mut cases, mut exact) = (0, 0);
    for fx in manifest["fixtures"].as_array().unwrap() {
        let file: &Path = &dir.join(fx["file"].as_str().unwrap());
        let nondeterministic: Vec<String> = fx["nondeterministic"]
            .as_array()
            .map(|a| a.iter().filter_map(|p| p.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let stored = |name: &Value, code: i64| Printed {
            stdout: std::fs::read_to_string(dir.join(name.as_str().unwrap())).unwrap(),
            code: code as i32,
        };
        for exp in fx["expected"].as_array().unwrap() {
            let leaf = leaf_of(exp);
            let batch = oracle::context_printed(file, leaf.as_deref());
            let want = stored(&exp["file"], exp["exitCode"].as_i64().unwrap_or(0));
            same(&format!("context {} leaf {leaf:?}", fx["name"]), &nondeterministic, &batch, &want);
            cases += 1;
            exact += usize::from(nondeterministic.is_empty());
        }
        for p in fx["prepare"].as_array().into_iter().flatten() {
            let leaf = leaf_of(p);
            let (keep, reserve) = (p["keepRecentTokens"].as_u64().unwrap(), p["reserveTokens"].as_u64().unwrap());
            let batch = oracle::prepare_printed(file, leaf.as_deref(), keep, reserve);
            same(&format!("prepare {} keep {keep}", fx["name"]), &nondeterministic, &batch, &stored(&p["file"], 0));
            cases += 1;
            exact += usize::from(nondeterministic.is_empty());
        }
    }
    assert!(cases > 30 && exact > 25, "{cases} cases, {exact} byte for byte");
}

#[test]
fn batch_output_is_byte_identical_to_the_scripts_run_one_process_each() {
    let dir = oracle_dir().join("fixtures");
    let f = |name: &str| dir.join(name).display().to_string();
    let prepare_args =
        |file: &str, keep: u64| vec![f(file), "--keep".into(), keep.to_string(), "--reserve".into(), "16384".into()];
    // Started together, awaited after the batch answers.
    let runs = [
        ("context.mjs", vec![f("02-branch-summary.jsonl")]),
        ("context.mjs", vec![f("02-branch-summary.jsonl"), "null".into()]),
        ("context.mjs", vec![f("01-linear-chat.jsonl"), "no-such-entry".into()]),
        ("prepare.mjs", prepare_args("07-compaction-split-turn.jsonl", 600)),
    ]
    .map(|(script, args)| (script, args.clone(), spawn_script(script, &args)));
    for (script, args, child) in runs {
        let path = Path::new(&args[0]);
        let leaf = args.get(1).filter(|a| !a.starts_with("--")).map(String::as_str);
        let batch = match script {
            "context.mjs" => oracle::context_printed(path, leaf),
            _ => oracle::prepare_printed(path, None, 600, 16384),
        };
        same(&format!("{script} {args:?}"), &[], &batch, &finish(child));
    }
}
