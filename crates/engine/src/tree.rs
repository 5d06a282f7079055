//! The session tree and its operations, as OpenClaw 2026.9.6 reads a transcript's tree (the
//! gateway's `sessions.branches.*`, `sessions.rewind`, `sessions.fork`, `sessions.tree`,
//! `sessions.label` and `chat.message.get` are these with their wire shapes): the tips one can
//! switch to ([`branches`]), moving the active leaf to a tip ([`switch`]) or to the parent of a
//! user message on the active path, handing its text back for editing ([`rewind`]), a new session
//! holding the active path before a user message ([`fork`]), one entry in full ([`message`]), the
//! message nodes with their parents and tips ([`tree`], for the WebChat's "‹ 2/3 ›") and Pi's labels
//! ([`label`]).
//!
//! A move of the leaf is one `leaf` control entry ([`NewEntry::move_leaf`]), which OpenClaw and Pi
//! read as the same leaf. Nothing is written when the input is wrong: the errors name the
//! session or the entry that was not found or not allowed.

use crate::error::EngineError;
use crate::sessions::SessionRef;
use crate::state::Engine;
use pincer_store::history::project_entry;
use pincer_store::session::{Kind, Session};
use pincer_store::{NewEntry, TranscriptsExt};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One entry of the tree, parents seen through `leaf` controls. Only what every method needs is
/// read up front (id, parent, type, a message's role); the entry itself is decoded when asked for.
struct Node {
    id: String,
    parent: Option<String>,
    kind: Kind,
    role: Option<String>,
    /// Index in the parsed session.
    at: usize,
    value: std::cell::OnceCell<Value>,
}

/// A transcript as a tree, with the leaf the store appends to.
struct Tree {
    parsed: Session,
    nodes: Vec<Node>,
    by_id: HashMap<String, usize>,
    leaf: Option<String>,
    /// Its room in the answer budget, while the tree is in memory.
    _held: crate::budget::Held,
}

/// A message's role from its raw JSON: Pi writes `role` first, so this rarely decodes the message.
fn raw_role(raw: &str) -> Option<String> {
    let quick = raw.strip_prefix("{\"role\":\"").and_then(|rest| rest.split('"').next());
    if let Some(r) = quick.filter(|r| !r.contains('\\')) {
        return Some(r.to_owned());
    }
    serde_json::from_str::<Value>(raw).ok()?.get("role")?.as_str().map(str::to_owned)
}

/// The parent a child of leaf control `start` gets: the first id up the chain of `parent`s from
/// `start` that is not a leaf control (or names no entry). Memoized in `through` for every control
/// walked, so all children of all controls together walk each control once; a cycle of controls
/// ends at the control where it closes.
fn resolve_controls(
    nodes: &[Node],
    by_id: &HashMap<String, usize>,
    through: &mut [Option<Option<String>>],
    start: usize,
) -> Option<String> {
    let mut walked = Vec::new();
    let mut on_walk = HashSet::new();
    let mut cur = start;
    let found = loop {
        if let Some(done) = &through[cur] {
            break done.clone();
        }
        if !on_walk.insert(cur) {
            break Some(nodes[cur].id.clone());
        }
        walked.push(cur);
        match nodes[cur].parent.as_ref().and_then(|id| by_id.get(id)).copied() {
            Some(pi) if nodes[pi].kind == Kind::Leaf => cur = pi,
            _ => break nodes[cur].parent.clone(),
        }
    };
    for w in walked {
        through[w] = Some(found.clone());
    }
    found
}

impl Tree {
    fn load(gw: &Engine, s: &SessionRef) -> Result<Tree, EngineError> {
        let held = gw.reserve_answer_blocking(&s.path, crate::budget::Answer::History, "the session's tree")?;
        let parsed =
            gw.store.read_session(&s.path).map_err(|e| EngineError::Persistence(format!("cannot read: {e}")))?;
        let (leaf, parsed) = match parsed {
            Some(p) => (current_leaf(gw, s)?, p),
            None => (None, Session::parse(Vec::new())),
        };
        let mut nodes: Vec<Node> = Vec::new();
        let mut by_id = HashMap::new();
        for (i, e) in parsed.entries.iter().enumerate() {
            let Some(id) = e.id.as_deref() else { continue };
            let value = std::cell::OnceCell::new();
            let raw_parent = match e.kind {
                // OpenClaw's reading: a leaf control hangs under its target.
                Kind::Leaf => {
                    let v = value.get_or_init(|| parsed.value(i).unwrap_or(Value::Null));
                    v.get("targetId").and_then(Value::as_str).map(str::to_owned)
                }
                _ => parsed.parent_index(i).and_then(|p| parsed.entries[p].id.as_deref()).map(str::to_owned),
            };
            let role = match e.kind {
                Kind::Message => parsed.raw_message(i).and_then(|m| raw_role(&m)),
                _ => None,
            };
            by_id.insert(id.to_owned(), nodes.len());
            nodes.push(Node { id: id.to_owned(), parent: raw_parent, kind: e.kind, role, at: i, value });
        }
        // Children of a leaf control continue from its target: each leaf control's first ancestor
        // that is not one is found once (a chain of controls is walked once, not once per child).
        let mut through: Vec<Option<Option<String>>> = vec![None; nodes.len()];
        for i in 0..nodes.len() {
            if nodes[i].kind == Kind::Leaf {
                continue;
            }
            let p = match nodes[i].parent.as_ref().and_then(|id| by_id.get(id)).copied() {
                Some(pi) if nodes[pi].kind == Kind::Leaf => resolve_controls(&nodes, &by_id, &mut through, pi),
                _ => continue,
            };
            nodes[i].parent = p;
        }
        Ok(Tree { parsed, nodes, by_id, leaf, _held: held })
    }

    /// The entry as it is on disk (decoded once).
    fn value<'a>(&'a self, n: &'a Node) -> &'a Value {
        n.value.get_or_init(|| self.parsed.value(n.at).unwrap_or(Value::Null))
    }

    fn get(&self, id: &str) -> Option<&Node> {
        self.by_id.get(id).map(|&i| &self.nodes[i])
    }

    /// Root-first path to `id` (leaf controls left out).
    fn path(&self, id: Option<&str>) -> Vec<&Node> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut cur = id.and_then(|i| self.get(i));
        while let Some(n) = cur {
            if !seen.insert(n.id.as_str()) {
                break;
            }
            if n.kind != Kind::Leaf {
                out.push(n);
            }
            cur = n.parent.as_deref().and_then(|p| self.get(p));
        }
        out.reverse();
        out
    }

    /// A value of node `start` computed along its path (as [`Tree::path`] walks it): a node's own
    /// value when `own` gives one (the walk stops there), else `step(node, its parent's value)`,
    /// `root` above the first node (or where a cycle closes). Memoized in `memo` (one slot per
    /// node), so the paths of every tip together cost the tree's size, not the sum of their
    /// lengths (a chain with a tip under every entry was quadratic).
    fn up<T: Clone>(
        &self,
        start: usize,
        memo: &mut [Option<T>],
        own: impl Fn(&Node) -> Option<T>,
        root: T,
        step: impl Fn(&Node, &T) -> T,
    ) -> T {
        let mut walked: Vec<usize> = Vec::new();
        let mut on_walk = HashSet::new();
        let mut cur = Some(start);
        let mut value = root;
        while let Some(i) = cur {
            if let Some(v) = &memo[i] {
                value = v.clone();
                break;
            }
            if !on_walk.insert(i) {
                break;
            }
            if let Some(v) = own(&self.nodes[i]) {
                memo[i] = Some(v.clone());
                value = v;
                break;
            }
            walked.push(i);
            cur = self.nodes[i].parent.as_deref().and_then(|p| self.by_id.get(p)).copied();
        }
        for &i in walked.iter().rev() {
            value = step(&self.nodes[i], &value);
            memo[i] = Some(value.clone());
        }
        value
    }

    /// Entries one can switch to: the active leaf and every entry without children (OpenClaw's
    /// `selectSessionTranscriptTreeTipNodes`), newest first with the active one ahead.
    fn tips(&self) -> Vec<&Node> {
        let parents: HashSet<&str> =
            self.nodes.iter().filter(|n| n.kind != Kind::Leaf).filter_map(|n| n.parent.as_deref()).collect();
        let mut tips: Vec<(usize, &Node)> = (self.nodes.iter().enumerate())
            .filter(|(_, n)| n.kind != Kind::Leaf)
            .filter(|(_, n)| self.leaf.as_deref() == Some(n.id.as_str()) || !parents.contains(n.id.as_str()))
            .collect();
        tips.sort_by_key(|(i, n)| (self.leaf.as_deref() != Some(n.id.as_str()), std::cmp::Reverse(*i)));
        tips.into_iter().map(|(_, n)| n).collect()
    }
}

/// The leaf the store appends to, and the entry `id` (if given) as it is on disk.
pub fn leaf_and_entry(
    gw: &Engine,
    s: &SessionRef,
    id: Option<&str>,
) -> Result<(Option<String>, Option<Value>), EngineError> {
    // The leaf alone is the store's (no read of the file); an entry needs the tree.
    let Some(id) = id else { return Ok((current_leaf(gw, s)?, None)) };
    let tree = Tree::load(gw, s)?;
    let entry = tree.get(id).map(|n| tree.value(n).clone());
    Ok((tree.leaf, entry))
}

/// The session's active leaf (`None` without a transcript).
fn current_leaf(gw: &Engine, s: &SessionRef) -> Result<Option<String>, EngineError> {
    let read = || Ok(if gw.store.exists(&s.path)? { gw.store.leaf(&s.path)? } else { None });
    read().map_err(|e: pincer_store::StoreError| EngineError::Persistence(format!("cannot read the leaf: {e}")))
}

fn role(n: &Node) -> Option<&str> {
    n.role.as_deref()
}

/// The text of a projected message as one trimmed line (titles, headlines).
pub fn display_text(message: &Value) -> String {
    pincer_pi::headline(message.get("content"), pincer_pi::HEADLINE_CHARS)
}

/// The session a tree operation works on: its key, and the agent the caller named (which must
/// agree with the key).
#[derive(Clone, Debug)]
pub struct SessionSel {
    pub key: String,
    pub agent_id: Option<crate::sessions::AgentId>,
}

/// A tip one can switch to (`sessions.branches.list`).
#[derive(Debug, Clone)]
pub struct Branch {
    pub leaf_entry_id: String,
    /// The text of the nearest message with text on its path (one line).
    pub headline: String,
    pub message_count: usize,
    pub active: bool,
    pub updated_at: Option<String>,
}

/// A message of the tree (`sessions.tree`): its parent and the newest tip below it.
#[derive(Debug, Clone)]
pub struct TreeNode {
    pub id: String,
    pub parent_id: Option<String>,
    pub role: String,
    pub tip_id: Option<String>,
}

/// What the recovery wrote about a turn it took up again ([`crate::durable::RESUMED`],
/// [`crate::durable::INTERRUPTED`]): how often it was resumed, and why it was given up.
#[derive(Debug, Clone, Default)]
pub struct TurnMark {
    pub resumed: u64,
    pub interrupted: Option<Value>,
}

/// The session's messages as a tree, with Pi's labels and the recovery's marks.
#[derive(Debug, Clone)]
pub struct TreeView {
    pub session_key: String,
    pub leaf_id: Option<String>,
    pub nodes: Vec<TreeNode>,
    /// Target id → label, in the order first labelled.
    pub labels: Vec<(String, String)>,
    /// The turn's user message id → its mark, in file order.
    pub turns: Vec<(String, TurnMark)>,
}

/// One entry in full (`chat.message.get`).
#[derive(Debug, Clone)]
pub enum Message {
    /// The entry as a projected message (a compaction as a system message).
    Found(Value),
    /// No such session or entry.
    NotFound,
    /// The entry is not a message a client shows.
    NotVisible,
}

/// A label set or cleared (`sessions.label`).
#[derive(Debug, Clone)]
pub struct Labelled {
    /// The `label` entry written.
    pub entry_id: Option<String>,
    pub target_id: String,
    /// The label now (`None`: cleared).
    pub label: Option<String>,
}

/// The session of `sel` (the agent it names must agree with the key), if it exists.
fn find_session(gw: &Engine, sel: &SessionSel) -> Result<Option<SessionRef>, EngineError> {
    let key = &sel.key;
    if let Some(agent) = &sel.agent_id {
        let (_, from_key) = crate::sessions::canonical_key(key)?;
        if from_key != *agent {
            return Err(EngineError::invalid(format!(
                "agentId {:?} does not match sessionKey {key:?}",
                agent.as_str()
            )));
        }
    }
    gw.sessions.resolve(key, false)
}

/// The session a tree operation works on; unknown sessions are an error.
fn session_of(gw: &Engine, sel: &SessionSel) -> Result<SessionRef, EngineError> {
    find_session(gw, sel)?.ok_or_else(|| EngineError::NotFound(format!("session not found: {}", sel.key)))
}

/// The tips of the session's tree (`None`: no such session; OpenClaw answers it with no branches).
pub async fn branches(gw: &Arc<Engine>, sel: SessionSel) -> Result<Option<Vec<Branch>>, EngineError> {
    gw.blocking(move |gw| {
        let Some(s) = find_session(gw, &sel)? else { return Ok(None) };
        let tree = Tree::load(gw, &s)?;
        // Per node, memoized along the paths: its path's message count, and the nearest entry on
        // it (itself first) whose text gives the headline.
        let mut counts: Vec<Option<usize>> = vec![None; tree.nodes.len()];
        let mut heads: Vec<Option<Option<usize>>> = vec![None; tree.nodes.len()];
        let index = |n: &Node| tree.by_id.get(&n.id).copied();
        let branches = (tree.tips().into_iter())
            .map(|tip| {
                let at = index(tip).unwrap_or(0);
                let message_count =
                    tree.up(at, &mut counts, |_| None, 0, |n, above| above + usize::from(n.kind == Kind::Message));
                let has_text = |n: &Node| {
                    let text = matches!(role(n), Some("user" | "assistant"))
                        && !display_text(&tree.value(n)["message"]).is_empty();
                    text.then(|| index(n))
                };
                let head = tree.up(at, &mut heads, has_text, None, |_, above| *above);
                let headline = head.map(|h| display_text(&tree.value(&tree.nodes[h])["message"])).unwrap_or_default();
                let updated_at = (tree.value(tip).get("timestamp").and_then(Value::as_str))
                    .filter(|t| !t.trim().is_empty())
                    .map(str::to_owned);
                Branch {
                    leaf_entry_id: tip.id.clone(),
                    headline,
                    message_count,
                    active: tree.leaf.as_deref() == Some(tip.id.as_str()),
                    updated_at,
                }
            })
            .collect();
        Ok(Some(branches))
    })
    .await
}

/// Every message with its parent and the newest tip below it.
pub async fn tree(gw: &Arc<Engine>, sel: SessionSel) -> Result<TreeView, EngineError> {
    gw.blocking(move |gw| {
        let s = session_of(gw, &sel)?;
        let tree = Tree::load(gw, &s)?;
        // The newest tip under each entry: walk the tips newest first and claim their ancestors.
        let mut tip_of: HashMap<&str, &str> = HashMap::new();
        let mut tips = tree.tips();
        tips.sort_by_key(|n| std::cmp::Reverse(tree.by_id.get(&n.id).copied().unwrap_or(0)));
        // An entry already claimed was claimed with all its ancestors: each walk stops there.
        for tip in tips {
            let mut cur = Some(tip);
            while let Some(n) = cur {
                if tip_of.contains_key(n.id.as_str()) {
                    break;
                }
                tip_of.insert(n.id.as_str(), tip.id.as_str());
                cur = n.parent.as_deref().and_then(|p| tree.get(p));
            }
        }
        let nodes = (tree.nodes.iter())
            .filter_map(|n| {
                Some(TreeNode {
                    id: n.id.clone(),
                    parent_id: n.parent.clone(),
                    role: role(n)?.to_owned(),
                    tip_id: tip_of.get(n.id.as_str()).map(|t| (*t).to_owned()),
                })
            })
            .collect();
        let (labels, turns) = (labels(&tree), turn_marks(&tree));
        Ok(TreeView { session_key: s.key, leaf_id: tree.leaf.clone(), nodes, labels, turns })
    })
    .await
}

/// What the gateway's recovery wrote about each turn it took up again after a crash or restart,
/// by the id of the turn's user message.
fn turn_marks(tree: &Tree) -> Vec<(String, TurnMark)> {
    let mut out: Vec<(String, TurnMark)> = Vec::new();
    // The user rows by their turn's run id (a marker names its run; one may be chained below a
    // later turn, when its own was found moved past).
    let users: HashMap<&str, &Node> = (tree.nodes.iter().filter(|n| n.role.as_deref() == Some("user")))
        .filter_map(|n| {
            let key = tree.value(n).get("message")?.get("idempotencyKey")?.as_str()?;
            Some((crate::durable::run_of_user_key(key)?, n))
        })
        .collect();
    for n in tree.nodes.iter().filter(|n| n.kind == Kind::Custom) {
        let v = tree.value(n);
        let ty = v.get("customType").and_then(Value::as_str);
        if ty != Some(crate::durable::RESUMED) && ty != Some(crate::durable::INTERRUPTED) {
            continue;
        }
        let run = v.get("data").and_then(|d| d.get("runId")).and_then(Value::as_str);
        // The turn's user message: its run's, else the first user message up the marker's chain.
        let mut cur = run.and_then(|r| users.get(r).copied());
        if cur.is_none() {
            let mut seen = HashSet::new();
            cur = n.parent.as_deref().and_then(|p| tree.get(p));
            while let Some(c) = cur.filter(|c| c.role.as_deref() != Some("user") && seen.insert(c.id.as_str())) {
                cur = c.parent.as_deref().and_then(|p| tree.get(p));
            }
        }
        let Some(user) = cur.filter(|c| c.role.as_deref() == Some("user")) else { continue };
        let at = match out.iter().position(|(id, _)| *id == user.id) {
            Some(i) => i,
            None => {
                out.push((user.id.clone(), TurnMark::default()));
                out.len() - 1
            }
        };
        let mark = &mut out[at].1;
        if ty == Some(crate::durable::RESUMED) {
            mark.resumed += 1;
        } else {
            mark.interrupted =
                Some(v.get("data").and_then(|d| d.get("reason")).cloned().unwrap_or(json!("interrupted")));
        }
    }
    out
}

/// Pi's labels: the latest `label` entry per target wins; a falsy label clears it.
fn labels(tree: &Tree) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for n in tree.nodes.iter().filter(|n| n.kind == Kind::Label) {
        let v = tree.value(n);
        let Some(target) = v.get("targetId").and_then(Value::as_str) else { continue };
        let at = out.iter().position(|(t, _)| t == target);
        match (v.get("label").and_then(Value::as_str).filter(|l| !l.is_empty()), at) {
            (Some(l), Some(i)) => out[i].1 = l.to_owned(),
            (Some(l), None) => out.push((target.to_owned(), l.to_owned())),
            // As a JSON object's removal did (its last key takes the place).
            (None, Some(i)) => {
                out.swap_remove(i);
            }
            (None, None) => {}
        }
    }
    out
}

/// Tells every page of the session that its active branch changed.
fn announce(gw: &Engine, s: &SessionRef, reason: &str, leaf: Option<&str>) {
    gw.hub.sessions_changed_at(&s.key, reason, leaf);
}

/// Refuses tree changes while a turn of the session runs (OpenClaw's rule).
fn idle(gw: &Engine, s: &SessionRef, what: &str) -> Result<(), EngineError> {
    match gw.runs_of(&s.key).is_empty() {
        true => Ok(()),
        false => Err(EngineError::Busy(format!("{what} is unavailable while the agent is working."))),
    }
}

/// Moves the active leaf to tip `target`.
pub async fn switch(gw: &Arc<Engine>, sel: SessionSel, target: String) -> Result<(), EngineError> {
    let t = target.clone();
    let s = gw
        .blocking(move |gw| {
            let s = session_of(gw, &sel)?;
            check_not_archived(&s, "Branch switch")?;
            let tree = Tree::load(gw, &s)?;
            let Some(node) = tree.get(&t) else {
                return Err(EngineError::NotFound(format!("branch entry not found: {t} (not in session {})", s.key)));
            };
            if node.kind == Kind::Leaf || !tree.tips().iter().any(|n| n.id == t) {
                return Err(EngineError::invalid(format!("entry is not a branch tip: {t}")));
            }
            if tree.leaf.as_deref() == Some(t.as_str()) {
                return Err(EngineError::invalid(format!("branch is already active: {t}")));
            }
            Ok(s)
        })
        .await?;
    move_leaf(gw, &s, Some(&target), "Branch switch", "branch-switch").await
}

/// Appends the leaf move in the session's queue (never beside a turn being written).
async fn move_leaf(
    gw: &Arc<Engine>,
    s: &SessionRef,
    target: Option<&str>,
    what: &str,
    reason: &str,
) -> Result<(), EngineError> {
    idle(gw, s, what)?;
    let cancel = gw.stopping();
    let _slot = gw.slot_for(s, &cancel).await?;
    idle(gw, s, what)?;
    gw.append(s, NewEntry::move_leaf(target))
        .await
        .map_err(|e| EngineError::Persistence(format!("cannot write the branch change: {e}")))?;
    announce(gw, s, reason, target);
    Ok(())
}

fn check_not_archived(s: &SessionRef, what: &str) -> Result<(), EngineError> {
    match s.entry.contains_key("archivedAt") {
        true => Err(EngineError::invalid(format!("{what} is unavailable for archived sessions."))),
        false => Ok(()),
    }
}

/// A user message on the active path: its parent, text and the path before it.
struct Cut {
    parent: Option<String>,
    text: String,
    prefix: Vec<Value>,
}

fn cut_at(gw: &Engine, s: &SessionRef, entry_id: &str) -> Result<Cut, EngineError> {
    let tree = Tree::load(gw, s)?;
    let Some(node) = tree.get(entry_id) else {
        return Err(EngineError::NotFound(format!("message entry not found: {entry_id} (not in session {})", s.key)));
    };
    if role(node) != Some("user") {
        return Err(EngineError::invalid(format!("entry is not a user message: {entry_id}")));
    }
    let path = tree.path(tree.leaf.as_deref());
    let Some(at) = path.iter().position(|n| n.id == entry_id) else {
        return Err(EngineError::invalid(format!("message entry is not on the active path: {entry_id}")));
    };
    Ok(Cut {
        parent: node.parent.clone(),
        text: pincer_pi::text_blocks(tree.value(node)["message"].get("content")).concat(),
        prefix: path[..at].iter().map(|n| tree.value(n).clone()).collect(),
    })
}

/// Moves the leaf to the parent of user message `entry_id` on the active path: its text, for
/// editing (`None` when it has none).
pub async fn rewind(gw: &Arc<Engine>, sel: SessionSel, entry_id: String) -> Result<Option<String>, EngineError> {
    let (s, cut) = gw
        .blocking(move |gw| {
            let s = session_of(gw, &sel)?;
            check_not_archived(&s, "Rewind")?;
            let cut = cut_at(gw, &s, &entry_id)?;
            Ok((s, cut))
        })
        .await?;
    move_leaf(gw, &s, cut.parent.as_deref(), "Rewind", "rewind").await?;
    Ok(Some(cut.text).filter(|t| !t.is_empty()))
}

/// A new dashboard session holding the active path before user message `entry_id`: its key, and
/// the message's text for editing (`None` when it has none).
pub async fn fork(
    gw: &Arc<Engine>,
    sel: SessionSel,
    entry_id: String,
) -> Result<(String, Option<String>), EngineError> {
    let (source, cut) = gw
        .blocking(move |gw| {
            let s = session_of(gw, &sel)?;
            let cut = cut_at(gw, &s, &entry_id)?;
            Ok((s, cut))
        })
        .await?;
    let key = format!("agent:{}:dashboard:{}", source.agent_id, uuid::Uuid::new_v4());
    let k = key.clone();
    let label = source.entry.get("label").and_then(Value::as_str).map(|l| format!("Fork of {l}"));
    let created = gw
        .blocking(move |gw| {
            let s =
                gw.sessions.resolve(&k, true)?.ok_or_else(|| EngineError::Internal("session not created".into()))?;
            if let Some(l) = label {
                let mut f = serde_json::Map::new();
                f.insert("label".into(), json!(l.chars().take(crate::protocol::MAX_LABEL_CHARS).collect::<String>()));
                return gw.sessions.patch(&k, &f);
            }
            Ok(s)
        })
        .await?;
    gw.ensure_transcript(&created).await?;
    // The store gives the copies new ids: references between them (a compaction's first kept
    // entry, a label's target) follow.
    let mut ids: HashMap<String, String> = HashMap::new();
    for entry in cut.prefix {
        let Some(obj) = entry.as_object() else { continue };
        let kind = obj.get("type").and_then(Value::as_str).unwrap_or("custom").to_owned();
        let payload: serde_json::Map<String, Value> = (obj.iter())
            .filter(|(k, _)| !matches!(k.as_str(), "type" | "id" | "parentId" | "timestamp"))
            .map(|(k, v)| match (k.as_str(), v.as_str().and_then(|old| ids.get(old))) {
                ("firstKeptEntryId" | "targetId" | "fromId", Some(new)) => (k.clone(), json!(new)),
                _ => (k.clone(), v.clone()),
            })
            .collect();
        let a = gw
            .append(&created, NewEntry::of(&kind, payload))
            .await
            .map_err(|e| EngineError::Persistence(format!("cannot write the forked transcript: {e}")))?;
        if let (Some(old), Some(new)) = (obj.get("id").and_then(Value::as_str), a.id()) {
            ids.insert(old.to_owned(), new.to_owned());
        }
    }
    gw.hub.sessions_changed(&key, "fork");
    Ok((key, Some(cut.text).filter(|t| !t.is_empty())))
}

/// Entry `id` of the session in full (up to `max_chars` per text).
pub async fn message(gw: &Arc<Engine>, sel: SessionSel, id: String, max_chars: usize) -> Result<Message, EngineError> {
    gw.blocking(move |gw| {
        let Some(s) = find_session(gw, &sel)? else { return Ok(Message::NotFound) };
        let tree = Tree::load(gw, &s)?;
        let Some(node) = tree.get(&id) else { return Ok(Message::NotFound) };
        let value = tree.value(node);
        let message = match node.kind {
            Kind::Compaction => Some(json!({
                "role": "system",
                "content": [{"type": "text", "text": value.get("summary").and_then(Value::as_str).unwrap_or("")}],
                "__openclaw": {"kind": "compaction", "id": node.id,
                    "firstKeptEntryId": value.get("firstKeptEntryId"), "tokensBefore": value.get("tokensBefore")},
            })),
            _ => project_entry(value, max_chars),
        };
        Ok(message.map_or(Message::NotVisible, Message::Found))
    })
    .await
}

/// Sets (or, with no text, clears) a Pi `label` on entry `target` of the session.
pub async fn label(
    gw: &Arc<Engine>,
    sel: SessionSel,
    target: String,
    label: Option<String>,
) -> Result<Labelled, EngineError> {
    let text = match &label {
        None => String::new(),
        Some(l) if l.chars().count() <= crate::protocol::MAX_LABEL_CHARS => l.trim().to_owned(),
        Some(_) => {
            return Err(EngineError::invalid(format!(
                "label must be a string of at most {} characters",
                crate::protocol::MAX_LABEL_CHARS
            )))
        }
    };
    if text.chars().any(char::is_control) {
        return Err(EngineError::invalid("label must not contain control characters"));
    }
    let t = target.clone();
    let s = gw
        .blocking(move |gw| {
            let s = session_of(gw, &sel)?;
            let tree = Tree::load(gw, &s)?;
            if tree.get(&t).is_none_or(|n| n.kind == Kind::Leaf) {
                return Err(EngineError::NotFound(format!("entry not found: {t} (not in session {})", s.key)));
            }
            Ok(s)
        })
        .await?;
    idle(gw, &s, "Labelling")?;
    let cancel = gw.stopping();
    let _slot = gw.slot_for(&s, &cancel).await?;
    let mut payload = serde_json::Map::new();
    payload.insert("targetId".into(), json!(target));
    if !text.is_empty() {
        payload.insert("label".into(), json!(text));
    }
    let a = gw
        .append(&s, NewEntry::of("label", payload))
        .await
        .map_err(|e| EngineError::Persistence(format!("cannot write the label: {e}")))?;
    announce(gw, &s, "label", a.id());
    Ok(Labelled { entry_id: a.id().map(str::to_owned), target_id: target, label: Some(text).filter(|t| !t.is_empty()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_are_read_without_decoding_when_role_comes_first() {
        assert_eq!(raw_role(r#"{"role":"user","content":"x"}"#).as_deref(), Some("user"));
        assert_eq!(raw_role(r#"{"content":"x","role":"assistant"}"#).as_deref(), Some("assistant"));
        assert_eq!(raw_role(r#"{"role":"us\"er","content":"x"}"#).as_deref(), Some("us\"er"));
        assert_eq!(raw_role(r#"{"content":"x"}"#), None);
        assert_eq!(raw_role("not json"), None);
    }

    #[test]
    fn headlines_are_one_line_and_bounded() {
        assert_eq!(display_text(&json!({"content": "a\n\n  b\tc"})), "a b c");
        let long = display_text(&json!({"content": [{"type": "text", "text": "x".repeat(500)}]}));
        assert_eq!(long.chars().count(), pincer_pi::HEADLINE_CHARS);
        assert!(long.ends_with('…'));
    }
}
