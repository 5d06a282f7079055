//! The process-wide budget for memory that answers built whole hold at once (`chat.history`,
//! `sessions.export` over the socket and HTTP, `sessions.archives.get`): each reserves what its
//! transcript may cost before reading it, and gives it back when the answer is sent. Reservations
//! together never exceed the budget; one larger than the whole budget runs alone (it waits for the
//! others and holds the whole budget). A reservation that cannot be had within [`WAIT`] is refused
//! with an error saying the gateway is busy — ten large answers at once run one after another
//! instead of each holding its transcript in memory at the same time.

use crate::error::EngineError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget (512 MiB).
pub const BUDGET_BYTES: u64 = 512 * 1024 * 1024;
/// Reservations are counted in units of this many bytes.
const UNIT: u64 = 64 * 1024;
/// How long a reservation may wait for room.
pub const WAIT: Duration = Duration::from_secs(30);

/// How many times its transcript's size an answer may hold (the bytes read, and what is built).
#[derive(Clone, Copy, Debug)]
pub enum Answer {
    /// `chat.history`, `sessions.archives.get`: the lines read and the messages parsed from them.
    History,
    /// An export as JSONL (a copy of the file), Markdown or HTML (the page is ~3.7× the file).
    Export(pincer_export::Format),
}

impl Answer {
    fn factor(self) -> u64 {
        match self {
            Answer::History => 2,
            Answer::Export(pincer_export::Format::Jsonl) => 2,
            Answer::Export(pincer_export::Format::Markdown) => 3,
            Answer::Export(pincer_export::Format::Html) => 5,
        }
    }
}

/// The budget; one per gateway.
pub struct Budget {
    permits: Arc<Semaphore>,
    units: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(BUDGET_BYTES)
    }
}

/// A reservation; its bytes return to the budget when it is dropped.
pub struct Held(#[allow(dead_code)] OwnedSemaphorePermit);

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        let units = u32::try_from((bytes / UNIT).max(1)).unwrap_or(u32::MAX >> 4).min(Semaphore::MAX_PERMITS as u32);
        Budget { permits: Arc::new(Semaphore::new(units as usize)), units }
    }

    /// Reserves room for an answer of kind `answer` over a transcript of `transcript_bytes`
    /// (`what` names it in the error).
    pub async fn reserve(&self, answer: Answer, transcript_bytes: u64, what: &str) -> Result<Held, EngineError> {
        let bytes = transcript_bytes.saturating_mul(answer.factor());
        let units = u32::try_from(bytes.div_ceil(UNIT)).unwrap_or(u32::MAX).clamp(1, self.units);
        match tokio::time::timeout(WAIT, self.permits.clone().acquire_many_owned(units)).await {
            Ok(Ok(p)) => Ok(Held(p)),
            Ok(Err(_)) => Err(EngineError::Unavailable("the gateway is shutting down".into())),
            Err(_) => Err(EngineError::Unavailable(format!(
                "the gateway is busy with other large answers ({what} needs {} MB of its {} MB for answers); try again shortly",
                bytes.div_ceil(1024 * 1024),
                BUDGET_BYTES / (1024 * 1024)
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reservations_never_exceed_the_budget_and_a_huge_one_runs_alone() {
        let b = Budget::new(10 * UNIT);
        let a = b.reserve(Answer::History, 2 * UNIT, "a").await.expect("a"); // 4 units
        let c = b.reserve(Answer::History, 3 * UNIT, "c").await.expect("c"); // 6 units: full
        assert_eq!(b.permits.available_permits(), 0);
        drop(a);
        assert_eq!(b.permits.available_permits(), 4);
        drop(c);
        let huge = b.reserve(Answer::Export(pincer_export::Format::Html), 1000 * UNIT, "huge").await.expect("alone");
        assert_eq!(b.permits.available_permits(), 0, "the huge one holds the whole budget");
        let waiting = tokio::time::timeout(Duration::from_millis(50), b.reserve(Answer::History, 1, "small")).await;
        assert!(waiting.is_err(), "a small one waits while the huge one runs");
        drop(huge);
        assert!(b.reserve(Answer::History, 1, "small").await.is_ok());
    }
}
