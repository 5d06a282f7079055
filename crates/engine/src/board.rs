//! What each messaging channel reports, for the `status` method, `/api/channels` and
//! `pincer channels status`: its state, its account and its counters (with the Prometheus
//! counters). The adapters (`pincer_gateway::channels`) write it; nothing here talks to a platform.

use crate::protocol::ChannelStatus;
use pincer_pi::lock;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What a channel counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A message from an allowed sender started (or joined) a turn.
    Received,
    /// A message that was already a turn (redelivered, replayed): no second turn.
    Deduplicated,
    /// A message from a sender not on the allowlist: no turn.
    Refused,
    /// A message sent or edited on the platform.
    Sent,
    /// A send, edit or poll the platform refused or that failed.
    Failed,
}

const EVENTS: [Event; 5] = [Event::Received, Event::Deduplicated, Event::Refused, Event::Sent, Event::Failed];

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Received => "received",
            Event::Deduplicated => "deduplicated",
            Event::Refused => "refused",
            Event::Sent => "sent",
            Event::Failed => "failed",
        }
    }
}

/// One channel's live state, for `status` and `pincer channels status`.
#[derive(Default)]
pub struct ChannelStats {
    counts: [AtomicU64; 5],
    /// `starting`, `running`, `error: …`, `standby` (another replica polls).
    state: Mutex<String>,
    account: Mutex<String>,
}

impl ChannelStats {
    /// Counts an event (and the Prometheus counter).
    pub fn count(&self, channel: &str, e: Event) {
        self.counts[e as usize].fetch_add(1, Ordering::Relaxed);
        crate::metrics::channel_event(channel, e.as_str());
    }

    /// Sets the state shown by `status`.
    pub fn set_state(&self, state: impl Into<String>) {
        *lock(&self.state) = state.into();
    }

    /// Sets the account shown by `status` (a bot's `@name (id)`).
    pub fn set_account(&self, account: impl Into<String>) {
        *lock(&self.account) = account.into();
    }
}

/// Every started channel's [`ChannelStats`].
#[derive(Default)]
pub struct Board {
    stats: Mutex<BTreeMap<&'static str, Arc<ChannelStats>>>,
}

impl Board {
    /// The stats of channel `name` (created at first use, so an adapter counts from its start).
    pub fn stats(&self, name: &'static str) -> Arc<ChannelStats> {
        let mut s = lock(&self.stats);
        s.entry(name)
            .or_insert_with(|| {
                for e in EVENTS {
                    crate::metrics::channel_event_register(name, e.as_str());
                }
                Arc::new(ChannelStats { state: Mutex::new("starting".into()), ..Default::default() })
            })
            .clone()
    }

    /// Counts an event of channel `name`.
    pub fn count(&self, name: &'static str, e: Event) {
        self.stats(name).count(name, e);
    }

    /// `[{id, state, account, received, deduplicated, refused, sent, failed}]`, one per started channel
    /// (the `status` RPC's `channels`).
    pub fn status(&self) -> Value {
        let stats = lock(&self.stats);
        let rows: Vec<ChannelStatus> = stats
            .iter()
            .map(|(name, s)| {
                let n = |e: Event| s.counts[e as usize].load(Ordering::Relaxed);
                ChannelStatus {
                    id: name,
                    state: lock(&s.state).clone(),
                    account: lock(&s.account).clone(),
                    received: n(Event::Received),
                    deduplicated: n(Event::Deduplicated),
                    refused: n(Event::Refused),
                    sent: n(Event::Sent),
                    failed: n(Event::Failed),
                }
            })
            .collect();
        serde_json::to_value(rows).unwrap_or_default()
    }
}
