//! Appends of other replicas: one connection outside the pool `LISTEN`s on [`crate::CHANNEL`] (and
//! on [`CONTROL_CHANNEL`] for aborts) and turns each notification (`<file>:<seq>`, a wake-up only)
//! into a [`Wake`]. The connection is
//! re-opened (and `LISTEN` said again) whenever it drops; each (re)start sends [`Wake::All`],
//! since notifications sent while it was away are lost. Notifications are only hints: whoever
//! watches a transcript reads its rows after the seq it has seen, and polls now and then anyway.

use crate::runs::CONTROL_CHANNEL;
use crate::{PgStore, CHANNEL};
use futures::StreamExt;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_util::sync::CancellationToken;

/// What a watcher should look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wake {
    /// A transcript has rows up to `seq`.
    Appended { file: String, seq: i64 },
    /// Anything may have changed (the listener (re)connected): check every watched transcript.
    All,
    /// Another replica asks to abort this run, because of `origin` ([`crate::runs::CONTROL_CHANNEL`]).
    Abort { run_id: String, origin: String },
}

/// Parses a notification payload `<file>:<seq>`.
pub fn parse_payload(payload: &str) -> Option<Wake> {
    let (file, seq) = payload.rsplit_once(':')?;
    Some(Wake::Appended { file: file.to_owned(), seq: seq.parse().ok()? })
}

impl PgStore {
    /// Starts the listener (once per store); wake-ups go to the returned channel's subscribers
    /// until `stop` is cancelled.
    pub fn listen(&self, stop: CancellationToken) -> broadcast::Sender<Wake> {
        let (tx, _) = broadcast::channel(1024);
        let config = self.inner.config.clone();
        let sender = tx.clone();
        self.handle().spawn(async move {
            loop {
                if stop.is_cancelled() {
                    return;
                }
                match config.connect(NoTls).await {
                    Ok((client, mut conn)) => {
                        let (note_tx, mut note_rx) = tokio::sync::mpsc::unbounded_channel();
                        let driver = tokio::spawn(async move {
                            let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
                            while let Some(m) = messages.next().await {
                                match m {
                                    Ok(AsyncMessage::Notification(n)) => {
                                        let wake = match n.channel() {
                                            CONTROL_CHANNEL => n.payload().split_once(':').map(|(origin, run)| {
                                                Wake::Abort { run_id: run.to_owned(), origin: origin.to_owned() }
                                            }),
                                            _ => parse_payload(n.payload()),
                                        };
                                        let Some(wake) = wake else { continue };
                                        if note_tx.send(wake).is_err() {
                                            return;
                                        }
                                    }
                                    Ok(_) => {}
                                    Err(_) => return,
                                }
                            }
                        });
                        if client.batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {CONTROL_CHANNEL}")).await.is_ok() {
                            let _ = sender.send(Wake::All);
                            loop {
                                tokio::select! {
                                    n = note_rx.recv() => match n {
                                        Some(w) => {
                                            let _ = sender.send(w);
                                        }
                                        None => break,
                                    },
                                    _ = stop.cancelled() => {
                                        driver.abort();
                                        return;
                                    }
                                }
                            }
                        }
                        driver.abort();
                        tracing::warn!("the PostgreSQL listener lost its connection; reconnecting");
                    }
                    Err(e) => tracing::warn!("the PostgreSQL listener cannot connect: {e}"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
        tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads() {
        assert_eq!(
            parse_payload("agents/main/sessions/a:b.jsonl:12"),
            Some(Wake::Appended { file: "agents/main/sessions/a:b.jsonl".into(), seq: 12 })
        );
        assert_eq!(parse_payload("nonsense"), None);
    }
}
