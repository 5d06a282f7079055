//! The shape of the two top crates, checked from their sources: within the engine and within the
//! gateway, no module reaches back to one that uses it (each crate's modules form a DAG, so any
//! one can be read, tested and moved with only the modules below it), and the engine depends on
//! no HTTP server crate. A module here is a top-level file or folder of `src/`; it uses another
//! when it names `crate::<other>` (a path or a `use crate::{…}` group) outside comments.
#![allow(clippy::disallowed_methods, clippy::unwrap_used, clippy::expect_used)] // reads sources; fails loudly

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The identifiers starting each path of a `use crate::{…}` group (at its first level).
fn group_heads(group: &str) -> Vec<String> {
    let (mut depth, mut heads, mut expect) = (0usize, Vec::new(), true);
    let mut chars = group.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' => {
                depth += 1;
                expect = depth == 1;
            }
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 1 => expect = true,
            c if expect && depth == 1 && (c.is_ascii_alphabetic() || c == '_') => {
                let mut id = c.to_string();
                while let Some(&n) = chars.peek().filter(|n| n.is_ascii_alphanumeric() || **n == '_') {
                    id.push(n);
                    chars.next();
                }
                heads.push(id);
                expect = false;
            }
            _ => {}
        }
        if depth == 0 && c == '}' {
            break;
        }
    }
    heads
}

/// The modules `src` names as `crate::<module>`.
fn uses(src: &str) -> BTreeSet<String> {
    let code: String = src.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if rest.starts_with('{') {
            out.extend(group_heads(rest));
        } else {
            out.insert(rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect());
        }
    }
    out
}

/// Each top-level module of `src` and the sibling modules it uses.
fn graph(src: &Path) -> Graph {
    let mut g = Graph::new();
    let mut stack = vec![src.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).unwrap();
            let top = rel.components().next().unwrap().as_os_str().to_string_lossy();
            let module = top.trim_end_matches(".rs").to_owned();
            if module == "lib" || module == "main" {
                continue;
            }
            let used = uses(&std::fs::read_to_string(&p).unwrap());
            g.entry(module).or_default().extend(used);
        }
    }
    let names: BTreeSet<String> = g.keys().cloned().collect();
    for (m, used) in g.iter_mut() {
        used.retain(|u| u != m && names.contains(u));
    }
    g
}

/// A path from `from` back to itself, if there is one.
fn cycle_through(g: &Graph, from: &str) -> Option<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![vec![from.to_owned()]];
    while let Some(path) = stack.pop() {
        let last = path.last().unwrap();
        for next in &g[last] {
            if next == from {
                let mut cycle = path.clone();
                cycle.push(from.to_owned());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push(p);
            }
        }
    }
    None
}

fn assert_acyclic(krate: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src");
    let g = graph(&src);
    assert!(g.len() > 5, "{}: too few modules found ({g:?})", src.display());
    let cycles: Vec<String> = g.keys().filter_map(|m| cycle_through(&g, m)).map(|c| c.join(" → ")).collect();
    assert!(cycles.is_empty(), "crates/{krate}: modules that reach back to themselves:\n{}", cycles.join("\n"));
}

#[test]
fn the_engines_modules_form_a_dag() {
    assert_acyclic("engine");
}

#[test]
fn the_gateways_modules_form_a_dag() {
    assert_acyclic("gateway");
}

#[test]
fn the_engine_depends_on_no_http_server() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/Cargo.toml")).unwrap();
    for krate in ["axum", "hyper", "hyper-util", "tower", "tower-http", "tokio-tungstenite"] {
        let named = manifest.lines().any(|l| {
            l.trim_start().starts_with(&format!("{krate} ")) || l.trim_start().starts_with(&format!("{krate}."))
        });
        assert!(!named, "crates/engine/Cargo.toml depends on {krate}");
    }
}

#[test]
fn use_groups_and_paths_name_their_first_module() {
    let src = "use crate::{a::{B, c}, d};\nfn f() { crate::e::g(); }\n// crate::h\n";
    assert_eq!(uses(src), ["a", "d", "e"].into_iter().map(String::from).collect());
}
