//! Property: any sequence of appends, branches and leaf moves, written through the store and read
//! back from disk, gives the context an independent in-memory model of the tree predicts.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly

use pincer_store::{build_context, NewEntry, ParentChoice, Session, Store, StoreOptions};
use proptest::prelude::*;
use serde_json::json;
use std::collections::HashMap;

#[derive(Clone, Debug)]
enum Op {
    /// Append a message to the leaf.
    Append,
    /// Append a message under the n-th entry written so far.
    Branch(usize),
    /// Move the leaf to the n-th entry (or before the first one).
    MoveLeaf(Option<usize>),
    /// Append a non-message entry (a custom entry) to the leaf.
    Custom,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Append),
        2 => any::<usize>().prop_map(Op::Branch),
        1 => proptest::option::of(any::<usize>()).prop_map(Op::MoveLeaf),
        1 => Just(Op::Custom),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn tree_round_trips(ops in proptest::collection::vec(op(), 1..40)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("p.jsonl");
        let store = Store::new(StoreOptions::default());
        // The model: id -> (parent, text or None for non-messages), plus the leaf.
        let mut parent: HashMap<String, Option<String>> = HashMap::new();
        let mut text: HashMap<String, Option<String>> = HashMap::new();
        let mut ids: Vec<String> = Vec::new();
        let mut leaf: Option<String> = None;
        for (n, op) in ops.iter().enumerate() {
            let msg = json!({"role": "user", "content": format!("m{n}"), "timestamp": n});
            let (entry, is_msg) = match op {
                Op::Append => (NewEntry::message(msg), true),
                Op::Custom => (NewEntry::of("custom", serde_json::from_value(json!({"customType": "x", "data": n})).expect("map")), false),
                Op::Branch(k) if !ids.is_empty() => {
                    let mut e = NewEntry::message(msg);
                    e.parent = ParentChoice::Entry(ids[k % ids.len()].clone());
                    (e, true)
                }
                Op::Branch(_) => (NewEntry::message(msg), true),
                Op::MoveLeaf(k) => {
                    let target = k.filter(|_| !ids.is_empty()).map(|k| ids[k % ids.len()].clone());
                    store.append(&f, NewEntry::move_leaf(target.as_deref())).expect("move");
                    leaf = target;
                    continue;
                }
            };
            let expected_parent = match &entry.parent {
                ParentChoice::Entry(p) => Some(p.clone()),
                _ => leaf.clone(),
            };
            let a = store.append(&f, entry).expect("append");
            let id = a.id().expect("id").to_owned();
            prop_assert_eq!(a.entry["parentId"].as_str().map(str::to_owned), expected_parent.clone());
            parent.insert(id.clone(), expected_parent);
            text.insert(id.clone(), is_msg.then(|| format!("m{n}")));
            ids.push(id.clone());
            leaf = Some(id);
        }
        // The model's context: walk from its leaf.
        let mut want = Vec::new();
        let mut cur = leaf.clone();
        while let Some(id) = cur {
            if let Some(Some(t)) = text.get(&id) {
                want.push(t.clone());
            }
            cur = parent.get(&id).cloned().flatten();
        }
        want.reverse();
        let s = Session::parse(std::fs::read(&f).expect("read"));
        let got: Vec<String> = build_context(&s, &s.leaf).message_values().iter()
            .filter_map(|m| m["content"].as_str().map(str::to_owned)).collect();
        prop_assert_eq!(got, want);
        prop_assert!(s.problems.is_empty(), "problems: {:?}", s.problems);
        // A fresh store (new process) agrees on the leaf.
        let fresh = Store::new(StoreOptions::default()).leaf(&f).expect("leaf");
        prop_assert_eq!(fresh, leaf);
    }
}
