//! A session file read into memory and indexed the way Pi indexes it.
//!
//! [`Session::parse`] never changes the file it came from: v1/v2 files are migrated in memory only,
//! header-less files read as empty (Pi would truncate them), `null` lines are skipped (Pi crashes),
//! and everything unusual is recorded as a [`Problem`] for `verify`. Lines are indexed through the
//! light parse of [`crate::parse`]; whole entries are decoded only when asked for.

use crate::mapped::FileBytes;
use crate::parse::{self, Key, LineValue, Parent};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// Entry types Pi and OpenClaw know; anything else is [`Kind::Other`] and is kept as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Session,
    Message,
    ThinkingLevelChange,
    ModelChange,
    Compaction,
    BranchSummary,
    Custom,
    CustomMessage,
    Label,
    SessionInfo,
    /// OpenClaw's leaf control (`targetId` moves the active leaf).
    Leaf,
    /// An unknown type, or none (`42`, an object without `type`).
    Other,
}

impl Kind {
    pub(crate) fn from_type(ty: &str) -> Kind {
        match ty {
            "session" => Kind::Session,
            "message" => Kind::Message,
            "thinking_level_change" => Kind::ThinkingLevelChange,
            "model_change" => Kind::ModelChange,
            "compaction" => Kind::Compaction,
            "branch_summary" => Kind::BranchSummary,
            "custom" => Kind::Custom,
            "custom_message" => Kind::CustomMessage,
            "label" => Kind::Label,
            "session_info" => Kind::SessionInfo,
            "leaf" => Kind::Leaf,
            _ => Kind::Other,
        }
    }
}

/// A byte range inside a line, relative to the line's start, in 8 bytes: [`Span::NONE`] for none,
/// [`Span::FAR`] for one that does not fit (in a line of 4 GiB or more), found again by parsing the
/// line when it is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    at: u32,
    len: u32,
}

impl Span {
    /// No range (a raw JSON value is never empty).
    const NONE: Span = Span { at: 0, len: 0 };
    const FAR: Span = Span { at: u32::MAX, len: u32::MAX };

    fn new(at: usize, len: usize) -> Span {
        match (u32::try_from(at), u32::try_from(len)) {
            (Ok(at), Ok(len)) if at != u32::MAX => Span { at, len },
            _ => Span::FAR,
        }
    }
}

/// One indexed entry (a non-header parsed line). 72 bytes: the line is its offset and 32-bit length,
/// the raw `message` a [`Span`] of it.
#[derive(Clone, Debug)]
pub struct EntryRec {
    pub kind: Kind,
    /// False for lines that are JSON but not objects (`42`).
    pub is_object: bool,
    /// The line's length; `u32::MAX` for a line at least that long (its end is found again).
    line_len: u32,
    pub id: Option<Key>,
    pub parent: Parent,
    /// Byte offset of the line in the file (for reports).
    pub offset: usize,
    /// Where the raw `message` value is in the line (message entries read from disk).
    message: Span,
    /// The entry's value built in memory (migration, linking), which replaces the line.
    value: Option<Box<Value>>,
}

impl EntryRec {
    /// An entry read from bytes `start..end` of the file.
    fn from_line(kind: Kind, id: Option<Key>, parent: Parent, (start, end): (usize, usize), message: Span) -> EntryRec {
        EntryRec {
            kind,
            is_object: true,
            line_len: u32::try_from(end - start).unwrap_or(u32::MAX),
            id,
            parent,
            offset: start,
            message,
            value: None,
        }
    }
}

/// The active leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leaf {
    /// No entries.
    Empty,
    /// Before the first entry (`resetLeaf`, or a `leaf` control with `targetId: null`).
    Null,
    /// The entry at this index of [`Session::entries`] (it may lack an id, as in Pi's F22a).
    Entry(usize),
}

/// Something a reader had to work around.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The file has entries but no valid header first (Pi would truncate it).
    NoHeader { offset: usize, reason: String },
    /// A line that is not JSON (Pi skips it).
    Malformed { offset: usize },
    /// The last line is cut off (no newline and not JSON): a write interrupted by a crash.
    TornTail { offset: usize },
    /// The last line is complete JSON but lacks its newline.
    MissingNewline { offset: usize },
    /// A `null` line (Pi crashes on it; skipped).
    NullLine { offset: usize },
    /// A line that is JSON but not an object (Pi keeps it as an id-less entry).
    NotAnObject { offset: usize },
    /// A second `session` header (Pi's duplicate-header bug); ignored.
    ExtraHeader { offset: usize },
    /// Two entries share an id; the later one wins.
    DuplicateId { id: String, offset: usize },
    /// `parentId` names no entry; the chain restarts there.
    Orphan { id: String, parent: String, offset: usize },
    /// Entries without a `parentId` key (v1 style or raw appends).
    Linear { count: usize },
    /// Following `parentId` from this entry comes back to it.
    Cycle { ids: Vec<String> },
    /// Header version below 3: migrated in memory.
    OldVersion { version: u64 },
    /// An entry without an `id` (it cannot be a parent).
    MissingId { offset: usize },
    /// A message whose `role` Pi does not know: the model never sees it (found by `verify` only).
    UnknownRole { role: String, offset: usize },
}

/// What a non-blank line that is not an entry turned out to be (for rewriting it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LineRole {
    Header,
    ExtraHeader,
    Malformed,
    Null,
}

/// Entry ids to their index in [`Session::entries`], with a randomly seeded fast hasher.
pub type IdMap = HashMap<Key, usize, foldhash::fast::RandomState>;

/// A parsed, indexed session.
pub struct Session {
    buf: FileBytes,
    /// Every non-blank line that is not an entry: byte range and role (the entries' lines are
    /// theirs, in [`Session::entries`] or [`Session::headerless_entries`]).
    pub(crate) lines: Vec<(usize, usize, LineRole)>,
    /// The header (after in-memory migration), if the file has a valid one.
    pub header: Option<Map<String, Value>>,
    /// `header.version ?? 1` as found in the file; `None` without a valid header.
    pub source_version: Option<u64>,
    pub entries: Vec<EntryRec>,
    pub by_id: IdMap,
    /// Index of each entry's parent (resolved once; walks and checks use this, not `by_id`).
    parents: Vec<Option<usize>>,
    pub leaf: Leaf,
    pub problems: Vec<Problem>,
    /// True when a v1/v2 migration ran in memory.
    pub migrated: bool,
    /// Entries of a file without a valid header (Pi reads it as empty; `repair` can keep them).
    pub headerless_entries: Vec<EntryRec>,
}

impl Session {
    /// Reads and parses the transcript at `path`: the one place a whole transcript is read
    /// (context, compaction, the tree, the CLI). `Ok(None)` when there is no file; the file is
    /// never modified.
    pub fn read(path: &std::path::Path) -> Result<Option<Session>, crate::StoreError> {
        match read_whole(path) {
            Ok(bytes) => Ok(Some(Session::parse(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(crate::StoreError::Io { path: path.display().to_string(), source }),
        }
    }

    /// [`Session::read`] for the CLI's read-only commands: a large file is mapped instead of copied
    /// ([`crate::mapped::map`]), so a file shrunk by another program meanwhile ends the process
    /// (exit code 1, with a message). Never for the gateway or compaction.
    pub fn read_mapped(path: &std::path::Path) -> Result<Option<Session>, crate::StoreError> {
        let bytes = match std::fs::metadata(path) {
            Ok(m) if m.len() >= MAP_MIN_BYTES => crate::mapped::map(path),
            Ok(_) => read_whole(path).map(FileBytes::from),
            Err(e) => Err(e),
        };
        match bytes {
            Ok(bytes) => Ok(Some(Session::parse(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(crate::StoreError::Io { path: path.display().to_string(), source }),
        }
    }

    /// Parses a whole file. Never fails: what cannot be read becomes a [`Problem`].
    pub fn parse(buf: impl Into<FileBytes>) -> Session {
        Session::parse_with(buf.into(), KEY_TEXT_MAX)
    }

    /// [`Session::parse`] with at most `key_text_max` bytes of key text per part (tests set it low).
    fn parse_with(buf: FileBytes, key_text_max: usize) -> Session {
        let mut s = Session {
            buf,
            lines: Vec::new(),
            header: None,
            source_version: None,
            entries: Vec::new(),
            by_id: HashMap::default(),
            parents: Vec::new(),
            leaf: Leaf::Empty,
            problems: Vec::new(),
            migrated: false,
            headerless_entries: Vec::new(),
        };
        // The buffer is moved out while lines borrow from it, and put back at the end.
        let buf = std::mem::take(&mut s.buf);
        let parts = parse_all(&buf, key_text_max);
        let count = parts.iter().map(|p| p.lines.len()).sum();
        let mut scan = Scan {
            buf: &buf,
            last: parts.iter().rev().find_map(|p| p.lines.last().map(|l| (l.start, l.end))),
            header_seen: false,
            first_value_seen: false,
            headerless: false,
            entries: Vec::with_capacity(count),
            prev_object: None,
            parent_hints: Vec::with_capacity(count),
        };
        for mut part in parts {
            for line in std::mem::take(&mut part.lines) {
                scan.line(&mut s, line, &mut part);
            }
        }
        let Scan { header_seen, headerless, entries, parent_hints, .. } = scan;
        if headerless || !header_seen {
            // Pi reads such a file as an empty session. Keep what we found for `verify`/`repair`,
            // but expose no entries.
            s.header = None;
            s.source_version = None;
            s.entries = Vec::new();
            s.leaf = Leaf::Empty;
            if !entries.is_empty() && !headerless {
                s.problems.push(Problem::NoHeader { offset: 0, reason: "no session header".into() });
            }
            s.stash_headerless(entries);
            s.buf = buf;
            return s;
        }
        s.buf = buf;
        s.entries = entries;
        match s.source_version.filter(|v| *v < 3) {
            Some(v) => {
                s.problems.push(Problem::OldVersion { version: v });
                s.migrate(v);
                s.index(Vec::new());
            }
            None => s.index(parent_hints),
        }
        s
    }

    /// Header-less files keep their entries aside so `repair` can add a header in front of them.
    fn stash_headerless(&mut self, entries: Vec<EntryRec>) {
        self.headerless_entries = entries;
    }

    /// Builds `by_id`, the parents, the leaf and the structural problems. `hints` (one per entry, or
    /// none) name the entry an entry's parent id is the id of, as the parse saw it; without duplicate
    /// ids, that entry is the one `by_id` names, and the lookup is skipped. The hints become the
    /// parents (no second vector).
    fn index(&mut self, hints: Vec<Option<usize>>) {
        self.by_id = IdMap::with_capacity_and_hasher(self.entries.len(), Default::default());
        let mut linear = 0;
        let mut duplicates = false;
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(id) = &e.id {
                if self.by_id.insert(id.clone(), i).is_some() {
                    duplicates = true;
                    self.problems.push(Problem::DuplicateId { id: id.to_string(), offset: e.offset });
                }
            } else if e.is_object {
                self.problems.push(Problem::MissingId { offset: e.offset });
            }
            if e.is_object && e.parent == Parent::Absent {
                linear += 1;
            }
        }
        if linear > 0 {
            self.problems.push(Problem::Linear { count: linear });
        }
        let mut parents = hints;
        if duplicates || parents.len() != self.entries.len() {
            parents.clear();
            parents.resize(self.entries.len(), None);
        }
        for (e, slot) in self.entries.iter().zip(parents.iter_mut()) {
            let parent = match &e.parent {
                Parent::Id(p) => {
                    let found = match *slot {
                        Some(h) => Some(h),
                        None => self.by_id.get(p).copied(),
                    };
                    if let (None, Some(id)) = (found, &e.id) {
                        self.problems.push(Problem::Orphan {
                            id: id.to_string(),
                            parent: p.to_string(),
                            offset: e.offset,
                        });
                    }
                    found
                }
                _ => None,
            };
            *slot = parent;
        }
        self.parents = parents;
        self.leaf = self.leaf_from_tail();
        if let Some(ids) = self.find_cycle() {
            self.problems.push(Problem::Cycle { ids });
        }
    }

    /// The leaf as Pi finds it (the last entry in file order), except that an OpenClaw `leaf`
    /// control entry moves it to its `targetId`.
    fn leaf_from_tail(&self) -> Leaf {
        let Some(last) = self.entries.len().checked_sub(1) else {
            return Leaf::Empty;
        };
        let e = &self.entries[last];
        if e.kind == Kind::Leaf {
            if let Some(v) = self.value(last) {
                match v.get("targetId") {
                    Some(Value::Null) => return Leaf::Null,
                    Some(t) => {
                        if let Some(i) = parse::value_key(t).and_then(|k| self.by_id.get(&k).copied()) {
                            return Leaf::Entry(i);
                        }
                    }
                    None => {}
                }
            }
        }
        Leaf::Entry(last)
    }

    /// The id chain of a parent cycle reachable from any entry, if one exists. Walks are followed
    /// twice (to find, then to mark as done) rather than kept in a vector.
    fn find_cycle(&self) -> Option<Vec<String>> {
        let id = |i: usize| self.entries[i].id.as_deref().unwrap_or("?").to_string();
        // 0 = unvisited, 1 = on the current walk, 2 = known acyclic.
        let mut state = vec![0u8; self.entries.len()];
        for start in 0..self.entries.len() {
            if state[start] != 0 {
                continue;
            }
            let mut cur = Some(start);
            while let Some(i) = cur {
                match state[i] {
                    2 => break,
                    1 => {
                        // `i` is on this walk: the cycle is `i`, its parent, …, back to `i`.
                        let mut ids = vec![id(i)];
                        let mut next = self.parent_index(i);
                        while let Some(k) = next {
                            ids.push(id(k));
                            if k == i {
                                break;
                            }
                            next = self.parent_index(k);
                        }
                        return Some(ids);
                    }
                    _ => {}
                }
                state[i] = 1;
                cur = self.parent_index(i);
            }
            let mut cur = Some(start);
            while let Some(i) = cur.filter(|&i| state[i] == 1) {
                state[i] = 2;
                cur = self.parent_index(i);
            }
        }
        None
    }

    /// The file's bytes exactly as read.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Index of the entry's parent, if it has one that exists.
    pub fn parent_index(&self, i: usize) -> Option<usize> {
        self.parents.get(i).copied().flatten()
    }

    /// The bytes of the line an entry was read from.
    fn line(&self, e: &EntryRec) -> &[u8] {
        let end = match e.line_len {
            u32::MAX => memchr::memchr(b'\n', &self.buf[e.offset..]).map_or(self.buf.len(), |p| e.offset + p),
            len => e.offset + len as usize,
        };
        &self.buf[e.offset..end]
    }

    /// The full value of entry `i`, decoded on demand.
    pub fn value(&self, i: usize) -> Option<Value> {
        let e = &self.entries[i];
        match &e.value {
            Some(v) => Some((**v).clone()),
            None => serde_json::from_slice(self.line(e)).ok(),
        }
    }

    /// The raw JSON text of a message entry's `message`, straight from the file when possible
    /// (bytes that are not UTF-8 read as U+FFFD, as Pi reads them).
    pub fn raw_message(&self, i: usize) -> Option<std::borrow::Cow<'_, str>> {
        let e = &self.entries[i];
        match (&e.value, e.message) {
            (Some(v), _) => v.get("message").map(|m| std::borrow::Cow::Owned(m.to_string())),
            (None, Span::NONE) => None,
            (None, Span::FAR) => match parse::parse_line(self.line(e)) {
                Some(LineValue::Object(h)) => h.message.map(parse::lossy),
                _ => None,
            },
            (None, Span { at, len }) => {
                let at = e.offset + at as usize;
                Some(parse::lossy(&self.buf[at..at + len as usize]))
            }
        }
    }

    /// The raw line of entry `i` when it is still the file's own bytes.
    pub fn raw_line(&self, i: usize) -> Option<&[u8]> {
        let e = &self.entries[i];
        e.value.is_none().then(|| self.line(e))
    }

    /// Root-first path from entry `leaf`, stopping before an id repeats (a cycle) or at a missing parent.
    /// The flag is true when a cycle cut the walk.
    /// (Walked twice: to count, then to fill a vector of exactly that length from its end.)
    pub fn path_from(&self, leaf: usize) -> (Vec<usize>, bool) {
        let mut seen = vec![false; self.entries.len()];
        let mut cur = Some(leaf);
        let (mut len, mut cycle) = (0, false);
        while let Some(i) = cur {
            if std::mem::replace(&mut seen[i], true) {
                cycle = true;
                break;
            }
            len += 1;
            cur = self.parent_index(i);
        }
        let mut path = vec![0; len];
        let mut cur = leaf;
        for slot in path.iter_mut().rev() {
            *slot = cur;
            cur = self.parent_index(cur).unwrap_or(cur);
        }
        (path, cycle)
    }

    /// 1-based line number of a byte offset.
    pub fn line_of(&self, offset: usize) -> usize {
        memchr::memchr_iter(b'\n', &self.buf[..offset.min(self.buf.len())]).count() + 1
    }

    /// The printable leaf id (`null` when the leaf entry has no id, as Pi prints it).
    pub fn leaf_id(&self) -> Option<&str> {
        match self.leaf {
            Leaf::Entry(i) => self.entries[i].id.as_deref(),
            _ => None,
        }
    }

    /// Pi's `sessionId` (the header id).
    pub fn session_id(&self) -> Option<&str> {
        self.header.as_ref().and_then(|h| h.get("id")).and_then(Value::as_str)
    }

    /// True when the file has entries and none of them carries a `parentId` key (v1 style, or
    /// OpenClaw's raw appends): appending needs [`Session::link_linear`] first.
    pub fn is_linear(&self) -> bool {
        let mut objects = self.entries.iter().filter(|e| e.is_object).peekable();
        objects.peek().is_some() && objects.all(|e| e.parent == Parent::Absent)
    }

    /// Links entries that have no `parentId` key to the entry before them, giving id-less ones an
    /// 8-hex id (OpenClaw's linear → parent-linked migration). Existing ids and links are kept.
    pub fn link_linear(&mut self) {
        let mut prev: Option<Key> = None;
        for i in 0..self.entries.len() {
            if !self.entries[i].is_object {
                continue;
            }
            if self.entries[i].parent == Parent::Absent || self.entries[i].id.is_none() {
                let Some(Value::Object(mut obj)) = self.value(i) else {
                    continue;
                };
                if self.entries[i].id.is_none() {
                    let id = crate::ids::short_id();
                    obj.insert("id".into(), Value::String(id.clone()));
                    self.entries[i].id = Some(id.into());
                }
                if self.entries[i].parent == Parent::Absent {
                    let p = prev.as_deref().map(parse::key_to_value).unwrap_or(Value::Null);
                    obj.insert("parentId".into(), p);
                    self.entries[i].parent = parse::value_parent(&obj);
                }
                self.entries[i].value = Some(Box::new(Value::Object(obj)));
            }
            prev = self.entries[i].id.clone();
        }
        self.problems.retain(|p| !matches!(p, Problem::Linear { .. } | Problem::MissingId { .. }));
        self.by_id.clear();
        self.index(Vec::new());
    }

    /// Gives a header-less file a fresh header and exposes the entries Pi would have discarded.
    pub fn adopt_headerless(&mut self, header: Map<String, Value>) {
        self.source_version = Some(3);
        self.header = Some(header);
        self.entries = std::mem::take(&mut self.headerless_entries);
        self.problems.retain(|p| !matches!(p, Problem::NoHeader { .. }));
        self.index(Vec::new());
    }

    /// The file as it should be after migration or repair: the (migrated or new) header first,
    /// entries re-serialized where they changed and byte-identical where they did not, malformed
    /// lines kept verbatim. With `repair`, a torn tail and `null` lines are dropped and the
    /// result always ends in a newline.
    pub fn render(&self, repair: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.buf.len() + 256);
        let mut header_written = false;
        let push_header = |out: &mut Vec<u8>| {
            if let Some(h) = &self.header {
                if let Ok(b) = serde_json::to_vec(h) {
                    out.extend_from_slice(&b);
                    out.push(b'\n');
                }
            }
        };
        let torn = self.problems.iter().find_map(|p| match p {
            Problem::TornTail { offset } => Some(*offset),
            _ => None,
        });
        // The lines in file order: the other lines merged with the entries' (both in file order).
        let (mut others, mut entries, mut headerless) =
            (self.lines.iter().peekable(), self.entries.iter().peekable(), self.headerless_entries.iter().peekable());
        loop {
            let next =
                [others.peek().map(|l| l.0), entries.peek().map(|e| e.offset), headerless.peek().map(|e| e.offset)];
            let Some(first) = (0..3).filter(|&k| next[k].is_some()).min_by_key(|&k| next[k]) else { break };
            let (start, role) = match first {
                0 => match others.next() {
                    Some(&(start, end, role)) => (start, Ok((role, trim_cr(&self.buf[start..end])))),
                    None => break,
                },
                1 => match entries.next() {
                    Some(e) => (e.offset, Err((e, true))),
                    None => break,
                },
                _ => match headerless.next() {
                    Some(e) => (e.offset, Err((e, false))),
                    None => break,
                },
            };
            let (role, raw) = match role {
                Ok(other) => other,
                Err((e, exposed)) => {
                    let raw = trim_cr(self.line(e));
                    if !exposed || self.header.is_none() {
                        out.extend_from_slice(raw);
                    } else {
                        if !header_written {
                            push_header(&mut out);
                            header_written = true;
                        }
                        match &e.value {
                            Some(v) => match serde_json::to_vec(v) {
                                Ok(b) => out.extend_from_slice(&b),
                                Err(_) => out.extend_from_slice(raw),
                            },
                            None => out.extend_from_slice(raw),
                        }
                    }
                    out.push(b'\n');
                    continue;
                }
            };
            match role {
                LineRole::Header => {
                    push_header(&mut out);
                    header_written = true;
                    continue;
                }
                LineRole::Null if repair => continue,
                LineRole::Malformed if repair && torn == Some(start) => continue,
                // An adopted header goes before the first JSON line, or that line (a `null`, or
                // a `session` line with a bad id) would be read as the file's header again.
                LineRole::ExtraHeader | LineRole::Null if self.header.is_some() && !header_written => {
                    push_header(&mut out);
                    header_written = true;
                    out.extend_from_slice(raw);
                }
                _ => out.extend_from_slice(raw),
            }
            out.push(b'\n');
        }
        if !header_written {
            push_header(&mut out);
        }
        out
    }

    /// v1→v2→v3 migration in memory, exactly as Pi's `migrateToCurrentVersion` does it.
    fn migrate(&mut self, version: u64) {
        self.migrated = true;
        let mut values: Vec<Option<Value>> = (0..self.entries.len()).map(|i| self.value(i)).collect();
        if let Some(h) = self.header.as_mut() {
            h.insert("version".into(), Value::from(3));
        }
        if version < 2 {
            // `firstKeptEntryIndex` indexes the parsed array including the header at 0.
            let ids: Vec<String> = values.iter().map(|_| crate::ids::short_id()).collect();
            let mut prev: Option<String> = None;
            for (i, v) in values.iter_mut().enumerate() {
                let Some(Value::Object(obj)) = v else {
                    continue;
                };
                obj.insert("id".into(), Value::String(ids[i].clone()));
                obj.insert("parentId".into(), prev.clone().map(Value::String).unwrap_or(Value::Null));
                prev = Some(ids[i].clone());
                if obj.get("type").and_then(Value::as_str) == Some("compaction") {
                    if let Some(idx) = obj.get("firstKeptEntryIndex").and_then(Value::as_f64) {
                        // Index 0 is the header; only earlier entries have ids already.
                        let target = idx as usize;
                        if idx >= 1.0 && idx.fract() == 0.0 && target - 1 <= i {
                            obj.insert("firstKeptEntryId".into(), Value::String(ids[target - 1].clone()));
                        }
                        obj.remove("firstKeptEntryIndex");
                    }
                }
            }
        }
        for v in values.iter_mut() {
            if let Some(Value::Object(obj)) = v {
                if obj.get("type").and_then(Value::as_str) == Some("message") {
                    if let Some(Value::Object(m)) = obj.get_mut("message") {
                        if m.get("role").and_then(Value::as_str) == Some("hookMessage") {
                            m.insert("role".into(), Value::String("custom".into()));
                        }
                    }
                }
            }
        }
        for (e, v) in self.entries.iter_mut().zip(values) {
            if let Some(Value::Object(obj)) = &v {
                e.id = obj.get("id").and_then(parse::value_key);
                e.parent = parse::value_parent(obj);
            }
            if let Some(v) = v {
                e.value = Some(Box::new(v));
            }
        }
    }
}

/// Files at least this large are mapped by [`Session::read_mapped`]; smaller ones are read.
const MAP_MIN_BYTES: u64 = 1 << 20;

/// Files at least this large are read by several threads at once.
const PARALLEL_READ_BYTES: usize = 8 << 20;

/// The whole file at `path`, as `std::fs::read` gives it. Most of the cost of reading a large file
/// is the kernel filling the fresh buffer's pages (faults, zeroing, the copy), so a large file is
/// read by up to 4 threads, each into its own part of one buffer; a file that shrank meanwhile is
/// read again the plain way, and bytes appended meanwhile are read too.
pub fn read_whole(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::FileExt;
    let mut file = std::fs::File::open(path)?;
    let len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
    if len < PARALLEL_READ_BYTES || threads < 2 {
        return std::fs::read(path);
    }
    let mut buf = vec![0u8; len];
    let part = len.div_ceil(threads);
    let file_ref = &file;
    let complete = std::thread::scope(|scope| {
        let handles: Vec<_> = buf
            .chunks_mut(part)
            .enumerate()
            .map(|(i, chunk)| scope.spawn(move || file_ref.read_exact_at(chunk, (i * part) as u64)))
            .collect();
        handles.into_iter().map(|h| matches!(h.join(), Ok(Ok(())))).fold(true, |a, b| a & b)
    });
    if !complete {
        return std::fs::read(path);
    }
    // What was appended after the length was taken.
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(len as u64))?;
    file.read_to_end(&mut buf)?;
    Ok(buf)
}

/// A line without its trailing `\r` (CRLF files are rewritten with `\n`).
fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// One pass of [`Session::parse`] over the lines: what each line is, the problems found, the
/// entries in file order.
struct Scan<'a> {
    buf: &'a [u8],
    /// The last line's range (a torn tail or a missing newline can only be there).
    last: Option<(usize, usize)>,
    header_seen: bool,
    first_value_seen: bool,
    /// The first JSON line is not a valid header: Pi reads the file as empty.
    headerless: bool,
    entries: Vec<EntryRec>,
    /// The entry index of the previous object line, if it is an entry.
    prev_object: Option<usize>,
    /// Per entry: the entry its parent id is the id of, when the parse saw that it is the previous
    /// object line's id (see [`Session::index`]).
    parent_hints: Vec<Option<usize>>,
}

impl Scan<'_> {
    fn line(&mut self, s: &mut Session, line: ParsedLine, part: &mut ParsedPart) {
        let ParsedLine { start, end, value: v } = line;
        let at_end = self.last == Some((start, end)) && end == self.buf.len();
        if let Parsed::Malformed = v {
            s.problems.push(if at_end {
                Problem::TornTail { offset: start }
            } else {
                Problem::Malformed { offset: start }
            });
            s.lines.push((start, end, LineRole::Malformed));
            return;
        }
        if at_end {
            s.problems.push(Problem::MissingNewline { offset: start });
        }
        let first = !self.first_value_seen;
        self.first_value_seen = true;
        match v {
            Parsed::Malformed => {}
            Parsed::Null => {
                s.lines.push((start, end, LineRole::Null));
                s.problems.push(Problem::NullLine { offset: start });
                self.not_a_header(s, first, start, "the first JSON line is null");
            }
            Parsed::Scalar => {
                s.problems.push(Problem::NotAnObject { offset: start });
                self.not_a_header(s, first, start, "the first JSON line is not an object");
                self.push(
                    EntryRec {
                        is_object: false,
                        ..EntryRec::from_line(Kind::Other, None, Parent::Absent, (start, end), Span::NONE)
                    },
                    None,
                );
            }
            Parsed::Object { kind, id, parent, parent_is_prev, message } => {
                // Keys set aside are taken in the order they were made: the parent, then the id
                // (of every object, headers too).
                let parent = match parent {
                    ParsedParent::Absent => Parent::Absent,
                    ParsedParent::Root => Parent::Root,
                    ParsedParent::Id(r) => Parent::Id(part.key(r)),
                };
                let id = id.map(|r| part.key(r));
                if kind == Kind::Session {
                    self.prev_object = None;
                    return self.header(s, first, start, end);
                }
                let hint = self.prev_object.filter(|_| parent_is_prev);
                self.prev_object = Some(self.entries.len());
                self.not_a_header(s, first, start, "the first JSON line is not a session header");
                self.push(EntryRec::from_line(kind, id, parent, (start, end), message), hint);
            }
        }
    }

    /// A `session` line: the header when it is the first JSON line and its id is a string.
    fn header(&mut self, s: &mut Session, first: bool, start: usize, end: usize) {
        if !first {
            s.lines.push((start, end, LineRole::ExtraHeader));
            s.problems.push(Problem::ExtraHeader { offset: start });
            return;
        }
        match serde_json::from_slice::<Map<String, Value>>(&self.buf[start..end]) {
            Ok(h) if h.get("id").is_some_and(Value::is_string) => {
                s.source_version = Some(h.get("version").and_then(Value::as_u64).unwrap_or(1));
                s.lines.push((start, end, LineRole::Header));
                s.header = Some(h);
                self.header_seen = true;
            }
            _ => {
                self.headerless = true;
                s.lines.push((start, end, LineRole::ExtraHeader));
                s.problems.push(Problem::NoHeader { offset: start, reason: "the header's id is not a string".into() });
            }
        }
    }

    /// The first JSON line is something other than a header.
    fn not_a_header(&mut self, s: &mut Session, first: bool, offset: usize, reason: &str) {
        if first {
            self.headerless = true;
            s.problems.push(Problem::NoHeader { offset, reason: reason.into() });
        }
    }

    fn push(&mut self, e: EntryRec, hint: Option<usize>) {
        self.entries.push(e);
        self.parent_hints.push(hint);
    }
}

/// What the light parse found on one line, in the form the scan needs. It is made on the parse
/// threads, so that the sequential scan never reads the file's bytes again; keys are [`KeyRef`]s
/// into the key text of the part of the file the line is in (see [`ParsedPart`]). 36 bytes.
enum Parsed {
    /// Not JSON (Pi skips it).
    Malformed,
    /// A bare `null`.
    Null,
    /// JSON that is not an object.
    Scalar,
    /// An object; `message` is where its raw `message` is in the line. `parent_is_prev`: the
    /// parent's id is the id of the previous object line (the usual chain).
    Object { kind: Kind, id: Option<KeyRef>, parent: ParsedParent, parent_is_prev: bool, message: Span },
}

enum ParsedParent {
    Absent,
    Root,
    Id(KeyRef),
}

/// A key of a parsed line: bytes `start..end` of its part's key text, or, for a key that did not
/// fit in 4 GiB of key text, [`KeyRef::ASIDE`]: the next key of the part's `aside` list (the
/// scan takes them in the order they were made: each line's parent, then its id).
#[derive(Clone, Copy, PartialEq, Eq)]
struct KeyRef {
    start: u32,
    end: u32,
}

impl KeyRef {
    const ASIDE: KeyRef = KeyRef { start: u32::MAX, end: u32::MAX };
}

/// One line of a part: where it is, and what it is.
struct ParsedLine {
    start: usize,
    end: usize,
    value: Parsed,
}

/// A part of the file parsed by one thread: its lines, the key text their keys are ranges of, and
/// the keys that did not fit in it.
struct ParsedPart {
    lines: Vec<ParsedLine>,
    text: Arc<String>,
    aside: std::vec::IntoIter<Key>,
}

impl ParsedPart {
    fn key(&mut self, r: KeyRef) -> Key {
        if r == KeyRef::ASIDE {
            return self.aside.next().unwrap_or_else(|| Key::from(""));
        }
        parse::KeyText::key(&self.text, (r.start as usize, r.end as usize))
    }
}

/// Files at least this large are split into lines and parsed by several threads.
const PARALLEL_PARSE_BYTES: usize = 2 << 20;

/// The most key text a part's keys can be ranges of ([`KeyRef`] has 32-bit offsets).
const KEY_TEXT_MAX: usize = u32::MAX as usize - 1;

/// The lines of the file and their light parse, in file order; large files are split over the
/// available cores, each thread finding the lines of its part too.
fn parse_all(buf: &[u8], text_max: usize) -> Vec<ParsedPart> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).min(8);
    let start = parse::bom_len(buf);
    if threads < 2 || buf.len() < PARALLEL_PARSE_BYTES {
        return vec![parse_part(buf, start, buf.len(), text_max)];
    }
    // Parts of about equal size, each ending after a newline.
    let mut cuts = vec![start];
    for k in 1..threads {
        let at = (start + (buf.len() - start) * k / threads).max(cuts[cuts.len() - 1]);
        let cut = memchr::memchr(b'\n', &buf[at..]).map_or(buf.len(), |p| at + p + 1);
        cuts.push(cut);
    }
    cuts.push(buf.len());
    cuts.dedup();
    let parts = std::thread::scope(|scope| {
        let handles: Vec<_> = cuts
            .windows(2)
            .map(|w| (w[0], w[1]))
            .map(|(a, b)| scope.spawn(move || parse_part(buf, a, b, text_max)))
            .collect();
        handles.into_iter().map(|h| h.join().ok()).collect::<Option<Vec<_>>>()
    });
    // A panicking parser thread: parse everything here instead.
    parts.unwrap_or_else(|| vec![parse_part(buf, start, buf.len(), text_max)])
}

/// Finds and parses the lines in bytes `start..end` (which start at a line start). The keys of all
/// of them share one text (of at most `text_max` bytes; keys beyond go aside); a parent that is
/// the previous line's id (the usual chain) shares its range.
fn parse_part(buf: &[u8], start: usize, end: usize, text_max: usize) -> ParsedPart {
    // Room for lines of 128 bytes on average (transcript lines are longer), so the vector is
    // rarely grown.
    let mut lines = Vec::with_capacity((end - start) / 128 + 16);
    // About one key per line (a parent that is the previous line's id is not stored again): 10
    // bytes per 128 of the part, about 40 (a UUID) per line of a usual transcript's length, so the
    // text is rarely grown (what is reserved and not used is never touched).
    let mut text = parse::KeyText::with_capacity(lines.capacity() * 10);
    let mut aside = Vec::new();
    let mut key = |text: &mut parse::KeyText, k: &str| match text.len() + k.len() <= text_max {
        true => {
            let (a, b) = text.push(k);
            KeyRef { start: a as u32, end: b as u32 }
        }
        false => {
            aside.push(Key::from(k));
            KeyRef::ASIDE
        }
    };
    let mut prev_id: Option<KeyRef> = None;
    for (s, e) in parse::lines_iter(buf, start, end) {
        let line = &buf[s..e];
        let value = match parse::parse_line(line) {
            None => Parsed::Malformed,
            Some(LineValue::Null) => Parsed::Null,
            Some(LineValue::Scalar) => Parsed::Scalar,
            Some(LineValue::Object(h)) => {
                let kind = h.ty.as_deref().map(Kind::from_type).unwrap_or(Kind::Other);
                let mut parent_is_prev = false;
                let parent = match &h.parent {
                    None => ParsedParent::Absent,
                    Some(parse::ParentText::Root) => ParsedParent::Root,
                    Some(parse::ParentText::Id(p)) => ParsedParent::Id(match prev_id {
                        Some(r) if r != KeyRef::ASIDE && text.get((r.start as usize, r.end as usize)) == p.as_ref() => {
                            parent_is_prev = true;
                            r
                        }
                        _ => key(&mut text, p),
                    }),
                };
                let id = h.id.as_deref().map(|i| key(&mut text, i));
                prev_id = id;
                let message = match h.message {
                    Some(m) => Span::new(m.as_ptr() as usize - line.as_ptr() as usize, m.len()),
                    None => Span::NONE,
                };
                Parsed::Object { kind, id, parent, parent_is_prev, message }
            }
        };
        lines.push(ParsedLine { start: s, end: e, value });
    }
    ParsedPart { lines, text: text.finish(), aside: aside.into_iter() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> String {
        r#"{"type":"session","version":3,"id":"s","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/"}"#.to_owned() + "\n"
    }

    #[test]
    fn a_later_duplicate_id_takes_over_the_children_of_the_earlier_one_as_in_pi() {
        let file = header()
            + r#"{"type":"message","id":"x","parentId":null}
{"type":"message","id":"y","parentId":"x"}
{"type":"message","id":"x","parentId":"y"}
{"type":"message","id":"z","parentId":"x"}
"#;
        let s = Session::parse(file.into_bytes());
        // Pi's Map keeps the last entry with an id: both children hang under the second `x`.
        assert_eq!(s.by_id.get("x"), Some(&2));
        assert_eq!((s.parent_index(1), s.parent_index(3)), (Some(2), Some(2)));
        assert_eq!(s.parent_index(2), Some(1));
        assert!(s.problems.iter().any(|p| matches!(p, Problem::DuplicateId { .. })));
        assert!(s.problems.iter().any(|p| matches!(p, Problem::Cycle { .. })));
    }

    #[test]
    fn a_large_file_parsed_in_parts_links_every_entry() {
        // Large enough to be split over threads; a chain across the parts, with lines that are not
        // entries between its links (null, malformed, a second header).
        let mut file = header();
        let filler = "x".repeat(300);
        let mut want = Vec::new();
        let mut parent: Option<usize> = None;
        let mut n = 0;
        while file.len() < 3 * PARALLEL_PARSE_BYTES {
            let p = parent.map_or("null".to_owned(), |p| format!("\"e{p}\""));
            file += &format!("{{\"type\":\"message\",\"id\":\"e{n}\",\"parentId\":{p},\"message\":\"{filler}\"}}\n");
            want.push(parent);
            parent = Some(n);
            n += 1;
            if n % 997 == 0 {
                file += "null\n{\"broken\"\n";
            }
            if n % 1999 == 0 {
                file += &header();
            }
        }
        let s = Session::parse(file.into_bytes());
        assert_eq!(s.entries.len(), n);
        let got: Vec<Option<usize>> = (0..n).map(|i| s.parent_index(i)).collect();
        assert_eq!(got, want);
        assert_eq!(s.leaf, Leaf::Entry(n - 1));
        assert_eq!(build_context_len(&s), n);
    }

    #[test]
    fn keys_beyond_the_key_text_limit_are_set_aside_and_read_the_same() {
        let mut file = header();
        let mut parent = "null".to_owned();
        for n in 0..80_000 {
            let id = if n % 7 == 0 { format!("long-id-{n}-{}", "x".repeat(n % 50)) } else { format!("e{n}") };
            file +=
                &format!("{{\"type\":\"message\",\"id\":\"{id}\",\"parentId\":{parent},\"message\":{{\"n\":{n}}}}}\n");
            if n % 1000 == 0 {
                file += &header();
                file += "{\"type\":\"message\",\"id\":\"e5\",\"parentId\":\"nowhere\"}\n";
            }
            parent = format!("\"{id}\"");
        }
        assert!(file.len() > 2 * PARALLEL_PARSE_BYTES, "parsed in parts");
        let want = Session::parse(file.clone().into_bytes());
        for max in [0, 20, 100_000] {
            let got = Session::parse_with(file.clone().into_bytes().into(), max);
            let ids = |s: &Session| s.entries.iter().map(|e| (e.id.clone(), e.parent.clone())).collect::<Vec<_>>();
            assert!(ids(&got) == ids(&want), "{max}");
            assert_eq!(got.problems, want.problems);
            assert_eq!(got.leaf, want.leaf);
            assert_eq!(got.by_id.len(), want.by_id.len());
            let ctx = |s: &Session| crate::build_context(s, &s.leaf).to_json();
            assert_eq!(ctx(&got), ctx(&want));
        }
    }

    #[test]
    fn an_entry_whose_line_or_message_does_not_fit_32_bits_is_found_again() {
        let file = header()
            + r#"{"type":"message","id":"a","parentId":null,"message":{"role":"user","content":"hi"}}
{"type":"message","id":"b","parentId":"a","message":{"role":"assistant","content":"é"}}"#;
        let want = Session::parse(file.clone().into_bytes());
        let mut got = Session::parse(file.into_bytes());
        for e in &mut got.entries {
            e.line_len = u32::MAX;
            e.message = Span::FAR;
        }
        for i in 0..2 {
            assert_eq!(got.raw_line(i), want.raw_line(i));
            assert_eq!(got.raw_message(i), want.raw_message(i));
            assert_eq!(got.value(i), want.value(i));
            assert!(got.raw_message(i).is_some());
        }
        assert_eq!(got.render(true), want.render(true));
        assert_eq!(std::mem::size_of::<EntryRec>(), 72);
        assert_eq!(std::mem::size_of::<Parsed>(), 36);
    }

    fn build_context_len(s: &Session) -> usize {
        crate::build_context(s, &s.leaf).messages.len()
    }
}
