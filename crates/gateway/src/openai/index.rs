//! The conversation index: which session (and which entry of its tree) a stateless client's
//! history ends at. Every entry of every session gets the chain hash of the messages on its path
//! as an OpenAI client would resend them ([`super::wire::message_hash`]; entries a client never
//! sees inherit their parent's chain), and a map from chain hash to the entries that have it turns
//! "these N messages equal a prefix of some branch" into at most N hash lookups: the cost of a
//! match grows with the request, not with the number of sessions or their length.
//!
//! Built in memory from the transcripts on first use (read through the store, files or
//! PostgreSQL), then kept in step with every append of this gateway
//! ([`ConversationIndex::appended`]). A session that grew behind the index (another process, or
//! another replica on PostgreSQL) is caught up when it turns up as a candidate: only the entries
//! after the position the index has read are read. Sessions other replicas wrote to are learnt
//! from the database before each match (the transcripts changed since the last look, one indexed
//! query: [`ConversationIndex::touched`]) and caught up, or indexed when new here, so a match
//! costs what the request and the appends since cost, never a scan of every session. On files,
//! sessions another process adds, removes or re-keys are followed when an agent's `sessions.json`
//! changed ([`ConversationIndex::follow`], one stat per agent per request), and a history that
//! matches nowhere in full looks at every transcript's end once ([`ConversationIndex::catch_up_all`]):
//! another process may have grown one behind the index.

use super::wire::{chain, message_hash, Hash, ROOT};
use pincer_pi::lock;
use pincer_store::session::Kind;
use pincer_store::{Pos, Transcripts, TranscriptsExt};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Prefix of the idempotency keys of the OpenAI endpoint's turns (only those are indexed).
pub const KEY_PREFIX: &str = "oai-";

/// An entry of a session: its transcript and the entry's id.
type Spot = (Arc<Path>, Arc<str>);

/// One indexed session.
struct Tracked {
    key: String,
    /// Every entry's chain hash, and whether the entry is a message a client sees (then it is in
    /// [`Inner::by_hash`] under that hash).
    chains: HashMap<Arc<str>, (Hash, bool)>,
    /// User rows written by the OpenAI endpoint: entry id → (run id, timestamp in ms).
    keys: HashMap<Arc<str>, (Arc<str>, u64)>,
    /// Every entry's parent (to tell whether an entry is on the active branch).
    parents: HashMap<Arc<str>, Arc<str>>,
    /// User rows.
    users: HashSet<Arc<str>>,
    /// Entries a message is the child of (a user row in it has a reply).
    answered: HashSet<Arc<str>>,
    leaf: Option<Arc<str>>,
    /// The store's position the index has read up to ([`Transcripts::end`]; [`Pos::END`]: re-read it).
    len: Pos,
    /// The transcript's rewrite count when it was read ([`Transcripts::leaf_version`]).
    rewrites: u64,
    /// When it was last changed (the index's own clock).
    touched: u64,
}

impl Tracked {
    /// Notes what the index needs of a message entry `id` (a user row; the parent it answers).
    fn note_message(&mut self, id: &Arc<str>, message: Option<&Value>) {
        let Some(m) = message else { return };
        if m.get("role").and_then(Value::as_str) == Some("user") {
            self.users.insert(id.clone());
        }
        if let Some(parent) = self.parents.get(id) {
            self.answered.insert(parent.clone());
        }
    }

    /// Whether `id` is the user row the active branch's last turn answers: an ancestor of the leaf
    /// with no user row between them (and not the leaf itself: it has a reply).
    fn answered_by_leaf(&self, id: &str) -> bool {
        let Some(mut at) = self.leaf.clone() else { return false };
        for _ in 0..=self.parents.len() {
            let Some(parent) = self.parents.get(&at).cloned() else { return false };
            if &*parent == id {
                return true;
            }
            if self.users.contains(&parent) {
                return false;
            }
            at = parent;
        }
        false
    }
}

#[derive(Default)]
struct Inner {
    built: bool,
    by_hash: HashMap<Hash, Vec<Spot>>,
    sessions: HashMap<Arc<Path>, Tracked>,
    clock: u64,
    /// Transcripts written by others (another replica) since the last match, with their end and
    /// rewrite count then, to catch up first.
    touched: HashMap<PathBuf, (Pos, u64)>,
}

/// Where a client's history ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Match {
    pub key: String,
    pub path: PathBuf,
    /// How many history messages matched.
    pub depth: usize,
    /// The entry the matched messages end at.
    pub entry: String,
    /// The session's leaf, when it is on the matched entry's chain end (the history ends on the
    /// active branch: the turn continues there without moving the leaf).
    pub leaf: Option<String>,
}

/// A user row that already has a reply, which a request ends at (a regenerate).
#[derive(Clone, Debug, PartialEq)]
pub struct AnsweredUser {
    pub key: String,
    pub path: PathBuf,
    pub entry: String,
    /// It is the turn the session's leaf answers (the last turn of the active branch).
    pub latest: bool,
}

/// A turn of the OpenAI endpoint found in a transcript.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyedTurn {
    pub key: String,
    pub path: PathBuf,
    pub run_id: String,
    pub timestamp: u64,
}

pub struct ConversationIndex {
    inner: Mutex<Inner>,
    /// Where the transcripts are read from.
    store: Arc<dyn Transcripts>,
    /// When the store was last asked what changed (the store's clock; see
    /// [`ConversationIndex::sync_mark`]).
    synced: Mutex<Option<i64>>,
    /// The session indexes' stamps when the session list was last followed
    /// ([`ConversationIndex::index_changed`]).
    stamps: Mutex<Option<Vec<Option<pincer_store::IndexStamp>>>>,
}

impl Default for ConversationIndex {
    /// An index over JSONL files.
    fn default() -> Self {
        ConversationIndex::new(Arc::new(pincer_store::Store::new(pincer_store::StoreOptions::default())))
    }
}

impl Inner {
    fn forget(&mut self, path: &Path) {
        let Some((p, t)) = self.sessions.remove_entry(path) else { return };
        for (id, (hash, listed)) in &t.chains {
            if !*listed {
                continue;
            }
            if let Some(v) = self.by_hash.get_mut(hash) {
                v.retain(|(vp, vid)| !(Arc::ptr_eq(vp, &p) || **vp == *p) || vid != id);
                if v.is_empty() {
                    self.by_hash.remove(hash);
                }
            }
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Reads a transcript into the index (replacing what it had of it). A store that cannot answer
    /// now leaves what the index has (asked again at the next catch-up); a transcript that is gone
    /// is forgotten.
    fn index_file(&mut self, store: &dyn Transcripts, key: &str, path: &Path) {
        // The position first: what is appended meanwhile is read again, never missed.
        let len = match store.end(path) {
            Ok(Some(len)) => len,
            Ok(None) => return self.forget(path),
            Err(_) => return,
        };
        let rewrites = store.leaf_version(path).map_or(0, |(_, r)| r);
        let s = match store.read_session(path) {
            Ok(Some(s)) => s,
            Ok(None) => return self.forget(path),
            Err(_) => return,
        };
        self.forget(path);
        let n = s.entries.len();
        let mut memo: Vec<Option<Hash>> = vec![None; n];
        let mut own: Vec<Option<Option<Hash>>> = vec![None; n];
        let mut messages: Vec<Option<Value>> = vec![None; n];
        let message_of = |i: usize, messages: &mut Vec<Option<Value>>| -> Option<Value> {
            if messages[i].is_none() && s.entries[i].kind == Kind::Message {
                messages[i] = s.raw_message(i).and_then(|m| serde_json::from_str(&m).ok());
            }
            messages[i].clone()
        };
        let p = Arc::<Path>::from(path);
        let mut t = Tracked {
            key: key.to_owned(),
            chains: HashMap::with_capacity(n),
            keys: HashMap::new(),
            parents: HashMap::with_capacity(n),
            users: HashSet::new(),
            answered: HashSet::new(),
            leaf: s.leaf_id().map(Arc::from),
            len,
            rewrites,
            touched: 0,
        };
        for i in 0..n {
            // Walk up to an entry whose chain is known (parents usually come first in the file).
            let mut stack = vec![i];
            while let Some(&top) = stack.last() {
                if memo[top].is_some() || stack.len() > n + 1 {
                    break;
                }
                match s.parent_index(top) {
                    Some(parent) if memo[parent].is_none() && !stack.contains(&parent) => stack.push(parent),
                    _ => break,
                }
            }
            while let Some(j) = stack.pop() {
                if memo[j].is_some() {
                    continue;
                }
                let base = s.parent_index(j).and_then(|p| memo[p]).unwrap_or(ROOT);
                let m = message_of(j, &mut messages);
                let h = m.as_ref().and_then(message_hash);
                own[j] = Some(h);
                memo[j] = Some(h.map_or(base, |h| chain(base, h)));
            }
            // Its own copy: a session's keys share one text, which the index should not keep.
            let Some(id) = s.entries[i].id.as_deref().map(Arc::<str>::from) else { continue };
            let Some(c) = memo[i] else { continue };
            let listed = matches!(own[i], Some(Some(_)));
            if listed {
                self.by_hash.entry(c).or_default().push((p.clone(), id.clone()));
            }
            let message = message_of(i, &mut messages);
            if let Some(k) = message.as_ref().and_then(keyed) {
                t.keys.insert(id.clone(), k);
            }
            if let Some(parent) = s.parent_index(i).and_then(|p| s.entries[p].id.as_deref()) {
                t.parents.insert(id.clone(), Arc::from(parent));
            }
            t.note_message(&id, message.as_ref());
            t.chains.insert(id, (c, listed));
        }
        t.touched = self.tick();
        self.sessions.insert(p, t);
    }

    /// Brings a tracked session up to what its transcript holds now: the entries after the
    /// position read (entries already indexed are skipped); the whole transcript again when it
    /// shrank, is gone, or an entry's parent is unknown.
    fn catch_up(&mut self, store: &dyn Transcripts, path: &Path) {
        let Some((key, len)) = self.sessions.get(path).map(|t| (t.key.clone(), t.len)) else { return };
        // (A store that cannot answer now is asked again at the next catch-up.)
        let Ok(end) = store.end(path) else { return };
        match end {
            None => return self.forget(path),
            Some(e) if e == len => return,
            Some(e) if len == Pos::START || len == Pos::END || e < len => return self.index_file(store, &key, path),
            Some(_) => {}
        }
        let Ok(entries) = store.entries_from(path, len, u64::MAX) else { return self.index_file(store, &key, path) };
        for entry in &entries {
            if entry.get("type").and_then(Value::as_str) == Some("session") {
                continue;
            }
            if !self.add_entry(&key, path, entry) {
                return self.index_file(store, &key, path);
            }
        }
        if let (Some(t), Some(e)) = (self.sessions.get_mut(path), end) {
            t.len = e;
        }
    }

    /// Indexes one entry of a session (already indexed: nothing to do). False when its parent is
    /// not indexed (the session must be read again).
    fn add_entry(&mut self, key: &str, path: &Path, entry: &Value) -> bool {
        let Some(id) = entry.get("id").and_then(Value::as_str).map(Arc::<str>::from) else { return true };
        let parent = entry.get("parentId").and_then(Value::as_str);
        let now = self.tick();
        let p = match self.sessions.get_key_value(path) {
            Some((p, _)) => p.clone(),
            None => {
                let p = Arc::<Path>::from(path);
                let t = Tracked {
                    key: key.to_owned(),
                    chains: HashMap::new(),
                    keys: HashMap::new(),
                    parents: HashMap::new(),
                    users: HashSet::new(),
                    answered: HashSet::new(),
                    leaf: None,
                    len: Pos::START,
                    rewrites: 0,
                    touched: now,
                };
                self.sessions.insert(p.clone(), t);
                p
            }
        };
        let Some(t) = self.sessions.get_mut(path) else { return false };
        if t.chains.contains_key(&id) {
            return true;
        }
        let base = match parent {
            None => Some(ROOT),
            Some(parent) => t.chains.get(parent).map(|(c, _)| *c),
        };
        let Some(base) = base else { return false };
        let is_message = entry.get("type").and_then(Value::as_str) == Some("message");
        let message = entry.get("message").filter(|_| is_message);
        let h = message.and_then(message_hash);
        let c = h.map_or(base, |h| chain(base, h));
        if let Some(k) = message.and_then(keyed) {
            t.keys.insert(id.clone(), k);
        }
        if let Some(parent) = parent {
            t.parents.insert(id.clone(), Arc::from(parent));
        }
        t.note_message(&id, message);
        t.chains.insert(id.clone(), (c, h.is_some()));
        t.leaf = Some(id.clone());
        t.touched = now;
        if h.is_some() {
            self.by_hash.entry(c).or_default().push((p, id));
        }
        true
    }
}

/// Whether the transcript at `path` no longer ends where the index read it to (also when the store
/// cannot say: the catch-up then asks again).
fn stale(store: &dyn Transcripts, path: &Path, len: Pos) -> bool {
    !matches!(store.end(path), Ok(Some(end)) if end == len)
}

/// The run id and timestamp of a user row written by the OpenAI endpoint.
fn keyed(message: &Value) -> Option<(Arc<str>, u64)> {
    if message.get("role")?.as_str()? != "user" {
        return None;
    }
    let key = crate::durable::run_of_user_key(message.get("idempotencyKey")?.as_str()?)?;
    key.starts_with(KEY_PREFIX).then(|| (Arc::from(key), message.get("timestamp").and_then(Value::as_u64).unwrap_or(0)))
}

impl ConversationIndex {
    /// An index reading transcripts from `store`.
    pub fn new(store: Arc<dyn Transcripts>) -> ConversationIndex {
        ConversationIndex {
            inner: Mutex::new(Inner::default()),
            store,
            synced: Mutex::new(None),
            stamps: Mutex::new(None),
        }
    }

    /// When the caller last asked the store what changed (`None`: never), for a store shared by
    /// several processes (PostgreSQL replicas).
    pub fn sync_mark(&self) -> Option<i64> {
        *lock(&self.synced)
    }

    pub fn set_sync_mark(&self, mark: i64) {
        *lock(&self.synced) = Some(mark);
    }

    /// Notes that a transcript was written by someone else (another replica) and ends at `end`
    /// now, rewritten `rewrites` times: it is caught up (read again when rewritten), or indexed
    /// when new here, before the next match. Never blocks on the store; ignored until the index
    /// is built (the build reads everything).
    pub fn touched(&self, path: &Path, end: Pos, rewrites: u64) {
        let mut inner = lock(&self.inner);
        if inner.built && inner.sessions.get(path).is_none_or(|t| t.len != end || t.rewrites != rewrites) {
            inner.touched.insert(path.to_path_buf(), (end, rewrites));
        }
    }

    /// Catches up the transcripts [`ConversationIndex::touched`] named; the ones this index has
    /// never seen are returned, to be indexed with [`ConversationIndex::track`] under their
    /// session key. Blocking.
    pub fn catch_up(&self) -> Vec<PathBuf> {
        let mut inner = lock(&self.inner);
        let touched: Vec<(PathBuf, (Pos, u64))> = inner.touched.drain().collect();
        let mut unknown = Vec::new();
        for (path, (_, rewrites)) in touched {
            match inner.sessions.get(path.as_path()).map(|t| (t.rewrites == rewrites, t.key.clone())) {
                Some((true, _)) => inner.catch_up(self.store.as_ref(), &path),
                Some((false, key)) => inner.index_file(self.store.as_ref(), &key, &path),
                None => unknown.push(path),
            }
        }
        unknown
    }

    /// Records the session indexes' stamps now, and whether they differ from the last ones recorded
    /// (then the session list should be followed again: [`ConversationIndex::follow`]).
    pub fn index_changed(&self, now: Vec<Option<pincer_store::IndexStamp>>) -> bool {
        let mut last = lock(&self.stamps);
        let changed = last.as_ref() != Some(&now);
        *last = Some(now);
        changed
    }

    /// Follows the session list as it is now (key, transcript): sessions it names that the index
    /// lacks, or knows under another key, are indexed; indexed ones it no longer names are dropped.
    /// Sessions already indexed are not read again. Blocking.
    pub fn follow(&self, sessions: impl IntoIterator<Item = (String, PathBuf)>) {
        let mut inner = lock(&self.inner);
        if !inner.built {
            return;
        }
        let mut listed: HashSet<PathBuf> = HashSet::new();
        for (key, path) in sessions {
            if inner.sessions.get(path.as_path()).is_none_or(|t| t.key != key) {
                inner.index_file(self.store.as_ref(), &key, &path);
            }
            listed.insert(path);
        }
        let gone: Vec<PathBuf> =
            inner.sessions.keys().filter(|p| !listed.contains(&***p)).map(|p| p.to_path_buf()).collect();
        for p in gone {
            inner.forget(&p);
        }
    }

    /// Catches up every indexed session whose transcript grew or shrank behind the index (one
    /// `stat` each): for a history that matched nowhere in full, which another process may have
    /// written. Blocking.
    /// A store that cannot answer (a database outage) ends the pass at its first failure: asking
    /// every session in turn, each up to the store's timeout, would hold every request behind it.
    pub fn catch_up_all(&self) {
        let mut inner = lock(&self.inner);
        let store = self.store.as_ref();
        let mut stale = Vec::new();
        for (p, t) in &inner.sessions {
            match store.end(p) {
                Ok(Some(end)) if end == t.len => {}
                Ok(_) => stale.push(p.to_path_buf()),
                Err(_) => return,
            }
        }
        for p in stale {
            inner.catch_up(store, &p);
        }
    }

    /// Whether the index has been built (until then appends are not followed: the build reads them).
    pub fn is_built(&self) -> bool {
        lock(&self.inner).built
    }

    /// Builds the index from these sessions (key, transcript) unless it is built. Blocking.
    pub fn build(&self, sessions: impl IntoIterator<Item = (String, PathBuf)>) {
        let mut inner = lock(&self.inner);
        if inner.built {
            return;
        }
        for (key, path) in sessions {
            inner.index_file(self.store.as_ref(), &key, &path);
        }
        inner.built = true;
    }

    /// Makes sure a session is indexed as its transcript is now. Blocking.
    pub fn track(&self, key: &str, path: &Path) {
        let mut inner = lock(&self.inner);
        match inner.sessions.get(path).map(|t| t.key == key) {
            Some(true) => inner.catch_up(self.store.as_ref(), path),
            _ => inner.index_file(self.store.as_ref(), key, path),
        }
    }

    /// Drops a session (its transcript was archived or deleted).
    pub fn forget(&self, path: &Path) {
        lock(&self.inner).forget(path);
    }

    /// Follows one entry the gateway appended to `path` (as written). The position read stays
    /// where it was: the next match reads what came after it (this entry, skipped as known, and
    /// whatever another process or replica appended around it).
    pub fn appended(&self, key: &str, path: &Path, entry: &Value) {
        let mut inner = lock(&self.inner);
        if !inner.built {
            return;
        }
        if !inner.add_entry(key, path, entry) {
            if let Some(t) = inner.sessions.get_mut(path) {
                t.len = Pos::END; // its parent is not indexed: re-read the transcript when it matters
            }
        }
    }

    /// The deepest prefix of `chains` (the chain hash after each history message) that ends at an
    /// entry, in `within` only when given, in sessions `reaches` allows (by key). At most `chains.len()` lookups; candidates that grew
    /// behind the index are caught up first. Among several sessions, one whose active branch
    /// ends there wins, then the most recently changed. Blocking (the store's end of each candidate).
    pub fn deepest(
        &self,
        chains: &[Hash],
        within: Option<&Path>,
        reaches: &mut dyn FnMut(&str) -> bool,
    ) -> Option<Match> {
        let mut inner = lock(&self.inner);
        for _ in 0..3 {
            let mut found = None;
            for depth in (1..=chains.len()).rev() {
                let spots: Vec<Spot> = inner
                    .by_hash
                    .get(&chains[depth - 1])
                    .map(|v| {
                        v.iter()
                            .filter(|(p, _)| within.is_none_or(|w| w == &**p))
                            .filter(|(p, _)| inner.sessions.get(&**p).is_some_and(|t| reaches(&t.key)))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                if !spots.is_empty() {
                    found = Some((depth, spots));
                    break;
                }
            }
            let (depth, spots) = found?;
            let store = self.store.as_ref();
            let stale: Vec<Arc<Path>> = spots
                .iter()
                .filter_map(|(p, _)| inner.sessions.get(&**p).map(|t| (p, t)))
                .filter(|(p, t)| stale(store, p, t.len))
                .map(|(p, _)| p.clone())
                .collect();
            if !stale.is_empty() {
                for p in stale {
                    inner.catch_up(store, &p);
                }
                continue;
            }
            let want = chains[depth - 1];
            let best = spots
                .iter()
                .filter_map(|(p, id)| inner.sessions.get(&**p).map(|t| (p, id, t)))
                .map(|(p, id, t)| {
                    let leaf_on = t.leaf.as_ref().filter(|l| t.chains.get(&***l).is_some_and(|(c, _)| *c == want));
                    (leaf_on.is_some(), t.touched, p, id, t, leaf_on.cloned())
                })
                .max_by_key(|(on, touched, ..)| (*on, *touched))?;
            let (_, _, p, id, t, leaf) = best;
            return Some(Match {
                key: t.key.clone(),
                path: p.to_path_buf(),
                depth,
                entry: id.to_string(),
                leaf: leaf.map(|l| l.to_string()),
            });
        }
        None
    }

    /// The newest turn of the OpenAI endpoint whose user row ends the history `full` (the chain of
    /// the whole request) and whose run id starts with `run_prefix`.
    pub fn keyed_turn(&self, full: Hash, run_prefix: &str, reaches: &mut dyn FnMut(&str) -> bool) -> Option<KeyedTurn> {
        let inner = lock(&self.inner);
        inner
            .by_hash
            .get(&full)?
            .iter()
            .filter_map(|(p, id)| {
                let t = inner.sessions.get(&**p)?;
                let (run, ts) = t.keys.get(id)?;
                (run.starts_with(run_prefix) && reaches(&t.key)).then(|| KeyedTurn {
                    key: t.key.clone(),
                    path: p.to_path_buf(),
                    run_id: run.to_string(),
                    timestamp: *ts,
                })
            })
            .max_by_key(|k| k.timestamp)
    }

    /// A user row already answered whose chain is `full` (the whole request): the request is a
    /// regenerate of it. In `within` only when given, in sessions `reaches` allows; one whose
    /// active branch's last turn it is wins, then the most recently changed. Candidates that grew
    /// behind the index are caught up first. Blocking.
    pub fn answered_user(
        &self,
        full: Hash,
        within: Option<&Path>,
        reaches: &mut dyn FnMut(&str) -> bool,
    ) -> Option<AnsweredUser> {
        let mut inner = lock(&self.inner);
        let spots = |inner: &Inner, reaches: &mut dyn FnMut(&str) -> bool| -> Vec<Spot> {
            let listed = inner.by_hash.get(&full).map(Vec::as_slice).unwrap_or_default();
            listed
                .iter()
                .filter(|(p, _)| within.is_none_or(|w| w == &**p))
                .filter(|(p, _)| inner.sessions.get(&**p).is_some_and(|t| reaches(&t.key)))
                .cloned()
                .collect()
        };
        let store = self.store.as_ref();
        let stale: Vec<Arc<Path>> = spots(&inner, reaches)
            .iter()
            .filter(|(p, _)| inner.sessions.get(&**p).is_some_and(|t| stale(store, p, t.len)))
            .map(|(p, _)| p.clone())
            .collect();
        for p in stale {
            inner.catch_up(store, &p);
        }
        spots(&inner, reaches)
            .into_iter()
            .filter_map(|(p, id)| {
                let t = inner.sessions.get(&*p)?;
                (t.users.contains(&id) && t.answered.contains(&id)).then(|| (t.answered_by_leaf(&id), t.touched, p, id))
            })
            .max_by_key(|(latest, touched, ..)| (*latest, *touched))
            .and_then(|(latest, _, p, id)| {
                let t = inner.sessions.get(&*p)?;
                Some(AnsweredUser { key: t.key.clone(), path: p.to_path_buf(), entry: id.to_string(), latest })
            })
    }

    /// Sessions and entries indexed (for the benchmark's report).
    pub fn size(&self) -> (usize, usize) {
        let inner = lock(&self.inner);
        (inner.sessions.len(), inner.sessions.values().map(|t| t.chains.len()).sum())
    }
}

impl crate::state::TranscriptObserver for ConversationIndex {
    fn appended(&self, key: &str, path: &Path, entry: &Value) {
        ConversationIndex::appended(self, key, path, entry);
    }

    fn replaced(&self, key: &str, path: &Path) {
        self.forget(path);
        if self.is_built() {
            self.track(key, path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pincer_store::{NewEntry, Store, StoreOptions};
    use serde_json::json;

    fn chains_of(msgs: &[Value]) -> Vec<Hash> {
        let mut c = ROOT;
        msgs.iter()
            .map(|m| {
                c = chain(c, message_hash(m).expect("a client message"));
                c
            })
            .collect()
    }

    #[test]
    fn histories_are_found_at_their_entry_on_any_branch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.jsonl");
        let store = Store::new(StoreOptions::default());
        let add = |m: Value| store.append(&path, NewEntry::message(m)).expect("append").entry;
        let u1 = json!({"role": "user", "content": "one", "idempotencyKey": "oai-x:user", "timestamp": 7});
        let a1 = json!({"role": "assistant", "content": [{"type": "text", "text": "reply one"}], "stopReason": "stop"});
        let u2 = json!({"role": "user", "content": "two"});
        let e_u1 = add(u1.clone());
        let e_a1 = add(a1.clone());
        let _e_u2 = add(u2.clone());
        let idx = ConversationIndex::default();
        idx.build([("agent:main:a".to_string(), path.clone())]);
        let m = idx.deepest(&chains_of(&[u1.clone(), a1.clone()]), None, &mut |_| true).expect("found");
        assert_eq!((m.depth, m.entry.as_str(), m.leaf), (2, e_a1["id"].as_str().expect("id"), None));
        let edited = json!({"role": "user", "content": "two, edited"});
        let m = idx.deepest(&chains_of(&[u1.clone(), a1.clone(), edited]), None, &mut |_| true).expect("found");
        assert_eq!(m.depth, 2, "the edit diverges after the first reply");
        assert_eq!(idx.deepest(&chains_of(&[json!({"role": "user", "content": "other"})]), None, &mut |_| true), None);
        // The endpoint's turns are found by the chain of the whole request.
        let k = idx.keyed_turn(chains_of(std::slice::from_ref(&u1))[0], "oai-x", &mut |_| true).expect("keyed");
        assert_eq!((k.run_id.as_str(), k.timestamp), ("oai-x", 7));
        // Appends are followed; the leaf's chain tells that a history ends on the active branch.
        let e_a2 = store
            .append(&path, NewEntry::message(json!({"role": "assistant", "content": [{"type": "text", "text": "r2"}]})))
            .expect("append")
            .entry;
        idx.appended("agent:main:a", &path, &e_a2);
        let a2 = json!({"role": "assistant", "content": "r2"});
        let m = idx.deepest(&chains_of(&[u1, a1, u2, a2]), None, &mut |_| true).expect("found");
        assert_eq!((m.depth, m.leaf.as_deref()), (4, e_a2["id"].as_str()));
        assert!(e_u1["id"].is_string());
    }

    /// A transcript of one user message `u1`, and an index built over it.
    fn one_message_indexed(dir: &Path) -> (Store, PathBuf, Value, ConversationIndex) {
        let path = dir.join("s.jsonl");
        let store = Store::new(StoreOptions::default());
        let u1 = json!({"role": "user", "content": "one"});
        store.append(&path, NewEntry::message(u1.clone())).expect("append");
        let idx = ConversationIndex::default();
        idx.build([("agent:main:a".to_string(), path.clone())]);
        (store, path, u1, idx)
    }

    #[test]
    fn a_file_grown_behind_the_index_is_read_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, path, u1, idx) = one_message_indexed(dir.path());
        let a1 = json!({"role": "assistant", "content": [{"type": "text", "text": "r"}]});
        store.append(&path, NewEntry::message(a1.clone())).expect("append"); // not through the index
        let m = idx.deepest(&chains_of(&[u1, a1]), None, &mut |_| true).expect("found after a re-read");
        assert_eq!(m.depth, 2);
    }

    /// A transcript whose read fails after its end answered (a database's pool timing out between the
    /// two; here a link to `/proc/self/mem`, a file whose length reads 0 and whose bytes cannot be
    /// read): the session stays, and is read again once the store answers.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test moves the transcript aside and back itself
    fn a_transcript_read_again_while_the_store_fails_stays_indexed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, path, u1, idx) = one_message_indexed(dir.path());
        let aside = dir.path().join("aside");
        std::fs::rename(&path, &aside).expect("move aside");
        std::os::unix::fs::symlink("/proc/self/mem", &path).expect("a link");
        assert!(store.end(&path).is_ok_and(|e| e.is_some()), "its end answers");
        assert!(store.read_session(&path).is_err(), "its read fails");
        idx.catch_up_all();
        std::fs::remove_file(&path).expect("unlink");
        std::fs::rename(&aside, &path).expect("move back");
        let a1 = json!({"role": "assistant", "content": [{"type": "text", "text": "r"}]});
        store.append(&path, NewEntry::message(a1.clone())).expect("append"); // not through the index
        let m = idx.deepest(&chains_of(&[u1, a1]), None, &mut |_| true).expect("still indexed, and read again");
        assert_eq!(m.depth, 2);
    }

    /// A store that cannot answer for a moment (a database outage; here a symlink loop where the
    /// file was) is not a transcript that is gone: the session stays indexed, and a client's next
    /// request still continues it.
    #[test]
    #[allow(clippy::disallowed_methods)] // the test moves the transcript aside and back itself
    fn a_transcript_the_store_cannot_read_for_a_moment_stays_indexed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (store, path, u1, idx) = one_message_indexed(dir.path());
        let aside = dir.path().join("aside");
        std::fs::rename(&path, &aside).expect("move aside");
        std::os::unix::fs::symlink(&path, &path).expect("a link to itself");
        assert!(store.end(&path).is_err(), "the store cannot say where it ends");
        idx.catch_up_all();
        std::fs::remove_file(&path).expect("unlink");
        std::fs::rename(&aside, &path).expect("move back");
        let m = idx.deepest(&chains_of(&[u1]), None, &mut |_| true).expect("still indexed");
        assert_eq!(m.depth, 1);
    }
}
