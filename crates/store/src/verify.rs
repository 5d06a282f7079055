//! `verify` (what is wrong with a file, in words and as JSON) and `repair` (fix what can be fixed
//! without guessing, atomically, keeping a backup).

use crate::lock::LockRegistry;
use crate::session::{Problem, Session};
use crate::store::{new_header, StoreOptions};
use crate::StoreError;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

impl Problem {
    /// A stable kebab-case name.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::NoHeader { .. } => "no-header",
            Problem::Malformed { .. } => "malformed-line",
            Problem::TornTail { .. } => "torn-tail",
            Problem::MissingNewline { .. } => "missing-newline",
            Problem::NullLine { .. } => "null-line",
            Problem::NotAnObject { .. } => "not-an-object",
            Problem::ExtraHeader { .. } => "extra-header",
            Problem::DuplicateId { .. } => "duplicate-id",
            Problem::Orphan { .. } => "orphan",
            Problem::Linear { .. } => "linear-entries",
            Problem::Cycle { .. } => "parent-cycle",
            Problem::OldVersion { .. } => "old-version",
            Problem::MissingId { .. } => "missing-id",
            Problem::UnknownRole { .. } => "unknown-role",
        }
    }

    /// Whether `repair` fixes it.
    pub fn repairable(&self) -> bool {
        matches!(
            self,
            Problem::NoHeader { .. }
                | Problem::TornTail { .. }
                | Problem::MissingNewline { .. }
                | Problem::NullLine { .. }
                | Problem::Linear { .. }
                | Problem::OldVersion { .. }
        )
    }

    /// Where in the file the problem is (byte offset), for those found at one line.
    pub fn offset(&self) -> Option<usize> {
        match self {
            Problem::NoHeader { offset, .. }
            | Problem::Malformed { offset }
            | Problem::TornTail { offset }
            | Problem::MissingNewline { offset }
            | Problem::NullLine { offset }
            | Problem::NotAnObject { offset }
            | Problem::ExtraHeader { offset }
            | Problem::DuplicateId { offset, .. }
            | Problem::Orphan { offset, .. }
            | Problem::MissingId { offset }
            | Problem::UnknownRole { offset, .. } => Some(*offset),
            Problem::Linear { .. } | Problem::Cycle { .. } | Problem::OldVersion { .. } => None,
        }
    }

    /// One sentence saying what is wrong and what Pincer does about it.
    pub fn message(&self) -> String {
        match self {
            Problem::NoHeader { reason, .. } => format!("no valid session header: {reason}; Pi would truncate this file, Pincer reads it as empty and `repair` adds a header keeping every entry"),
            Problem::Malformed { .. } => "line is not valid JSON; skipped by readers".into(),
            Problem::TornTail { .. } => "the last line was cut off mid-write (a crash); skipped by readers, `repair` removes it (kept in the backup)".into(),
            Problem::MissingNewline { .. } => "the last line has no trailing newline".into(),
            Problem::NullLine { .. } => "a `null` line; Pi crashes on it, Pincer skips it, `repair` removes it".into(),
            Problem::NotAnObject { .. } => "a JSON value that is not an object; kept as an id-less entry, as Pi does".into(),
            Problem::ExtraHeader { .. } => "a second session header (Pi's duplicate-header bug); ignored".into(),
            Problem::DuplicateId { id, .. } => format!("id {id} appears more than once; the later entry wins"),
            Problem::Orphan { id, parent, .. } => format!("entry {id} names parent {parent}, which is not in the file; its chain starts there"),
            Problem::Linear { count } => format!("{count} entries have no parentId (linear, v1 style); `repair` links each to the one before"),
            Problem::Cycle { ids } => format!("parent cycle {}; Pi would hang, Pincer cuts the path where it repeats", ids.join(" -> ")),
            Problem::OldVersion { version } => format!("session format version {version}; migrated to 3 in memory, on disk by `repair` or the first append"),
            Problem::MissingId { .. } => "entry has no id, so nothing can be chained to it".into(),
            Problem::UnknownRole { role, .. } => format!(
                "message role {role:?} is not one Pi knows ({}); the model never sees this message",
                pincer_pi::MESSAGE_ROLES.join(", ")
            ),
        }
    }
}

/// The result of `verify`.
pub struct Report {
    pub file: PathBuf,
    pub session: Session,
}

impl Report {
    pub fn healthy(&self) -> bool {
        self.session.problems.is_empty()
    }

    pub fn to_json(&self) -> Value {
        let problems: Vec<Value> = self
            .session
            .problems
            .iter()
            .map(|p| {
                let mut v = json!({"kind": p.kind(), "message": p.message(), "repairable": p.repairable()});
                if let Some(o) = p.offset() {
                    v["line"] = json!(self.session.line_of(o));
                    v["offset"] = json!(o);
                }
                v
            })
            .collect();
        json!({
            "file": self.file.display().to_string(),
            "healthy": self.healthy(),
            "sessionId": self.session.session_id(),
            "version": self.session.source_version,
            "entries": self.session.entries.len(),
            "leafId": self.session.leaf_id(),
            "problems": problems,
        })
    }

    pub fn to_text(&self) -> String {
        let f = self.file.display();
        if self.healthy() {
            return format!(
                "{f}: healthy ({} entries, leaf {})\n",
                self.session.entries.len(),
                self.session.leaf_id().unwrap_or("none")
            );
        }
        let mut out = format!("{f}: {} problem(s)\n", self.session.problems.len());
        for p in &self.session.problems {
            match p.offset() {
                Some(o) => {
                    out.push_str(&format!("  line {}: [{}] {}\n", self.session.line_of(o), p.kind(), p.message()))
                }
                None => out.push_str(&format!("  [{}] {}\n", p.kind(), p.message())),
            }
        }
        if self.session.problems.iter().any(Problem::repairable) {
            out.push_str(&format!("  run `pincer transcript repair {f}` to fix the repairable ones\n"));
        }
        out
    }
}

/// Reads and checks a file (never changes it): what parsing finds, and messages with a role Pi
/// does not know.
pub fn verify(path: &Path) -> Result<Report, StoreError> {
    let data = std::fs::read(path).map_err(|source| StoreError::Io { path: path.display().to_string(), source })?;
    Ok(Report { file: path.to_path_buf(), session: checked(Session::parse(data)) })
}

/// `session` with its messages of unknown roles added to its problems (parsing does not look
/// inside messages; only `verify` and `repair` do).
fn checked(mut session: Session) -> Session {
    let unknown: Vec<Problem> = (0..session.entries.len())
        .filter(|&i| session.entries[i].kind == crate::session::Kind::Message)
        .filter_map(|i| {
            let message: Value = serde_json::from_str(&session.raw_message(i)?).ok()?;
            let role = message.get("role")?.as_str()?;
            (!pincer_pi::MESSAGE_ROLES.contains(&role))
                .then(|| Problem::UnknownRole { role: role.to_owned(), offset: session.entries[i].offset })
        })
        .collect();
    session.problems.extend(unknown);
    session
}

/// What `repair` did.
pub struct Repaired {
    /// The problems that were fixed.
    pub fixed: Vec<Problem>,
    /// The backup of the old file (`None` when nothing needed fixing).
    pub backup: Option<PathBuf>,
    /// What is still wrong (cannot be fixed without guessing).
    pub remaining: Vec<Problem>,
}

/// Fixes torn tails, missing newlines, `null` lines, linear entries, old versions and a missing
/// header, under the session lock, atomically, keeping `<file>.bak.<timestamp>`.
pub(crate) fn repair(path: &Path, opts: &StoreOptions, locks: &LockRegistry) -> Result<Repaired, StoreError> {
    let _guard = locks.acquire(path, &opts.lock)?;
    let report = verify(path)?;
    let mut s = report.session;
    let fixed: Vec<Problem> = s.problems.iter().filter(|p| p.repairable()).cloned().collect();
    if fixed.is_empty() {
        return Ok(Repaired { fixed, backup: None, remaining: s.problems });
    }
    if s.header.is_none() {
        if let Value::Object(h) = new_header(path, None, &opts.cwd) {
            s.adopt_headerless(h);
        }
    }
    if s.is_linear() {
        s.link_linear();
    }
    let content = s.render(true);
    let backup = crate::rewrite::replace_atomically(path, &content)?;
    let after = checked(Session::parse(content));
    Ok(Repaired { fixed, backup: Some(backup), remaining: after.problems })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Store, StoreOptions};

    #[test]
    fn repair_puts_the_new_header_before_a_header_line_with_a_bad_id() {
        // Found by fuzz/fuzz_targets/session_parse.rs (fixture 15d): the adopted header was written
        // after the bad `session` line, so the repaired file still had no header, and every further
        // repair added another header.
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("s.jsonl");
        std::fs::write(
            &f,
            "not json\n{\"type\":\"session\",\"version\":3,\"id\":42,\"timestamp\":\"2025-01-01T00:00:00.000Z\",\"cwd\":\"/\"}\n\
             {\"type\":\"message\",\"id\":\"a1\",\"parentId\":null,\"timestamp\":\"2025-01-01T00:00:01.000Z\",\"message\":{\"role\":\"user\",\"content\":\"one\",\"timestamp\":1}}\n",
        )
        .expect("write");
        let store = Store::new(StoreOptions::default());
        let r = store.repair(&f).expect("repair");
        assert!(r.fixed.iter().any(|p| matches!(p, Problem::NoHeader { .. })), "{:?}", r.fixed);
        assert!(!r.remaining.iter().any(Problem::repairable), "{:?}", r.remaining);
        let after = verify(&f).expect("verify").session;
        assert!(after.header.is_some());
        assert_eq!(after.entries.len(), 1);
        assert_eq!(after.leaf_id(), Some("a1"));
        let again = store.repair(&f).expect("second repair");
        assert!(
            again.fixed.is_empty() && again.backup.is_none(),
            "a second repair changed the file: {:?}",
            again.fixed
        );
    }

    #[test]
    fn a_message_of_an_unknown_role_is_reported_and_still_there_after_a_repair() {
        // A message Pi does not know on a last line without its newline (repairable): repair adds
        // the newline, and the message is still reported, before and after.
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("s.jsonl");
        std::fs::write(
            &f,
            "{\"type\":\"session\",\"version\":3,\"id\":\"s1\",\"timestamp\":\"2025-01-01T00:00:00.000Z\",\"cwd\":\"/\"}\n\
             {\"type\":\"message\",\"id\":\"a1\",\"parentId\":null,\"timestamp\":\"2025-01-01T00:00:01.000Z\",\"message\":{\"role\":\"robot\",\"content\":\"beep\",\"timestamp\":1}}",
        )
        .expect("write");
        let before = verify(&f).expect("verify");
        assert!(before
            .session
            .problems
            .iter()
            .any(|p| matches!(p, Problem::UnknownRole { role, .. } if role == "robot")));
        let store = Store::new(StoreOptions::default());
        let r = store.repair(&f).expect("repair");
        assert!(r.backup.is_some(), "the newline was added");
        assert_eq!(r.remaining.iter().map(Problem::kind).collect::<Vec<_>>(), ["unknown-role"], "{:?}", r.remaining);
        assert!(!verify(&f).expect("verify").healthy());
    }
}
