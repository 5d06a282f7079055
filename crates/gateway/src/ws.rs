//! One WebSocket connection: `connect.challenge`, the `connect` handshake (first frame, 64 KiB cap,
//! timeout, token and device checks, protocol 3–4) and `hello-ok`; then requests are dispatched
//! concurrently and bus events are forwarded with a per-connection `seq`. A slow consumer loses
//! droppable events (deltas; the `seq` still advances so the client sees the gap) and is closed with
//! 1008 only when an event that must not be lost cannot be queued.

use crate::config::AuthMode;
use crate::hub::{Audience, BusEvent};
use crate::protocol::{self, RpcError};
use crate::state::Gateway;
use crate::{Ctx, Subs};
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

/// Frames queued for one connection before it counts as a slow consumer.
const OUTBOUND_FRAMES: usize = 2048;

enum Out {
    Text(String),
    Close(u16, &'static str),
}

/// Constant-time comparison of secrets.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Token check of `connect` (the token may come as `auth.token` or `auth.password`).
pub fn check_auth(mode: &AuthMode, params: &Value) -> Result<(), RpcError> {
    let AuthMode::Token(token) = mode else { return Ok(()) };
    let auth = params.get("auth");
    let given: Vec<&str> =
        ["token", "password"].iter().filter_map(|k| auth.and_then(|a| a.get(*k)).and_then(Value::as_str)).collect();
    if given.is_empty() {
        return Err(RpcError::invalid("unauthorized: gateway token missing (send it as auth.token)")
            .with_details(json!({"code": "AUTH_TOKEN_MISSING"})));
    }
    if given.iter().any(|g| same_secret(g, token)) {
        Ok(())
    } else {
        Err(RpcError::invalid("unauthorized: gateway token mismatch")
            .with_details(json!({"code": "AUTH_TOKEN_MISMATCH"})))
    }
}

fn negotiate(params: &Value) -> Result<u64, RpcError> {
    let min = params.get("minProtocol").and_then(Value::as_u64);
    let max = params.get("maxProtocol").and_then(Value::as_u64);
    let (Some(min), Some(max)) = (min, max) else {
        return Err(RpcError::invalid("connect params need integer minProtocol and maxProtocol"));
    };
    let chosen = max.min(protocol::PROTOCOL_MAX);
    if min > max || chosen < min || chosen < protocol::PROTOCOL_MIN {
        return Err(RpcError::invalid(format!(
            "protocol mismatch: client speaks {min}..{max}, server speaks {}..{}",
            protocol::PROTOCOL_MIN,
            protocol::PROTOCOL_MAX
        ))
        .with_details(json!({"expectedProtocol": [protocol::PROTOCOL_MIN, protocol::PROTOCOL_MAX]})));
    }
    Ok(chosen)
}

fn hello(gw: &Gateway, protocol: u64, conn_id: u64, params: &Value) -> Value {
    let known = ["operator.admin", "operator.read", "operator.write", "operator.approvals", "operator.pairing"];
    let mut scopes: Vec<&str> = params
        .get("scopes")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).filter(|s| known.contains(s)).collect())
        .unwrap_or_default();
    for s in ["operator.read", "operator.write"] {
        if !scopes.contains(&s) {
            scopes.push(s);
        }
    }
    json!({
        "type": "hello-ok",
        "protocol": protocol,
        "server": {"version": env!("CARGO_PKG_VERSION"), "connId": format!("c-{conn_id}"), "name": "pincer"},
        "features": {"methods": protocol::METHODS, "events": protocol::EVENTS},
        "snapshot": {
            "presence": [], "health": {}, "stateVersion": {"presence": 0, "health": 0},
            "uptimeMs": gw.uptime_ms(),
            "sessionDefaults": {"defaultAgentId": "main", "mainKey": "main", "mainSessionKey": crate::sessions::MAIN_KEY},
            "authMode": match gw.settings.auth { AuthMode::Token(_) => "token", AuthMode::None => "none" },
        },
        "auth": {"role": "operator", "scopes": scopes},
        "policy": {"maxPayload": protocol::MAX_PAYLOAD_BYTES, "maxBufferedBytes": protocol::MAX_BUFFERED_BYTES,
            "tickIntervalMs": protocol::TICK_INTERVAL_MS},
    })
}

/// Serves one upgraded socket until it closes or the gateway shuts down.
pub async fn serve(socket: WebSocket, gw: Arc<Gateway>) {
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(OUTBOUND_FRAMES);
    let kill = CancellationToken::new();
    let writer_kill = kill.clone();
    let writer = tokio::spawn(async move {
        loop {
            let out = tokio::select! {
                o = out_rx.recv() => o,
                _ = writer_kill.cancelled() => Some(Out::Close(1008, "slow consumer")),
            };
            match out {
                Some(Out::Text(t)) => {
                    if sink.send(Message::Text(Utf8Bytes::from(t))).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close(code, reason)) => {
                    let _ = sink.send(Message::Close(Some(CloseFrame { code, reason: Utf8Bytes::from(reason) }))).await;
                    break;
                }
                None => break,
            }
        }
    });
    let conn_id = gw.next_conn_id();
    let nonce = uuid::Uuid::new_v4().to_string();
    let challenge = json!({"nonce": nonce, "ts": pincer_store::ids::now_ms()});
    let _ = out_tx.send(Out::Text(protocol::event("connect.challenge", &challenge, None))).await;

    // Handshake: the first frame must be `connect`.
    let first = tokio::time::timeout(Duration::from_millis(protocol::HANDSHAKE_TIMEOUT_MS), stream.next()).await;
    let text = match first {
        Err(_) => {
            let _ = out_tx.send(Out::Close(1008, "handshake timeout")).await;
            drop(out_tx);
            let _ = writer.await;
            return;
        }
        Ok(Some(Ok(Message::Text(t)))) => t.to_string(),
        Ok(Some(Ok(Message::Binary(_)))) => {
            let _ = out_tx.send(Out::Close(1003, "binary frames are not supported")).await;
            drop(out_tx);
            let _ = writer.await;
            return;
        }
        _ => {
            drop(out_tx);
            let _ = writer.await;
            return;
        }
    };
    let handshake = (|| {
        if text.len() > protocol::MAX_PREAUTH_PAYLOAD_BYTES {
            return Err((
                None,
                RpcError::invalid(format!(
                    "frame of {} bytes exceeds the {} byte limit before connect",
                    text.len(),
                    protocol::MAX_PREAUTH_PAYLOAD_BYTES
                )),
            ));
        }
        let req = protocol::parse_request(&text)?;
        let id = Some(req.id.clone());
        if req.method != "connect" {
            return Err((id, RpcError::invalid("the first request must be connect")));
        }
        let protocol = negotiate(&req.params).map_err(|e| (id.clone(), e))?;
        check_auth(&gw.settings.auth, &req.params).map_err(|e| (id.clone(), e))?;
        crate::device::verify(&req.params, &nonce)
            .map_err(|e| (id.clone(), RpcError::invalid(e.message).with_details(json!({"code": e.code}))))?;
        Ok((req, protocol))
    })();
    let (req, protocol_version) = match handshake {
        Ok(ok) => ok,
        Err((id, e)) => {
            tracing::info!(conn = conn_id, "connect refused: {}", e.message);
            let _ = out_tx.send(Out::Text(protocol::response(id.as_deref().unwrap_or("connect"), Err(e)))).await;
            let _ = out_tx.send(Out::Close(1008, "connect failed")).await;
            drop(out_tx);
            let _ = writer.await;
            return;
        }
    };
    let client_id = req.params.get("client").and_then(|c| c.get("id")).and_then(Value::as_str).unwrap_or("").to_owned();
    let _ = out_tx
        .send(Out::Text(protocol::response(&req.id, Ok(hello(&gw, protocol_version, conn_id, &req.params)))))
        .await;
    tracing::debug!(conn = conn_id, client = %client_id, "connected");

    let subs = Arc::new(Subs::default());
    let mut bus = gw.hub.subscribe();
    let mut seq: u64 = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(protocol::TICK_INTERVAL_MS));
    tick.tick().await;
    loop {
        tokio::select! {
            frame = stream.next() => {
                let text = match frame {
                    Some(Ok(Message::Text(t))) => t.to_string(),
                    Some(Ok(Message::Binary(_))) => {
                        let e = RpcError::invalid("binary frames are not supported; send JSON text frames");
                        let _ = out_tx.send(Out::Text(protocol::response("unknown", Err(e)))).await;
                        continue;
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => continue,
                };
                match protocol::parse_request(&text) {
                    Err((id, e)) => {
                        let _ = out_tx.send(Out::Text(protocol::response(id.as_deref().unwrap_or("unknown"), Err(e)))).await;
                    }
                    Ok(req) => {
                        let (gw, out_tx, subs, client_id) = (gw.clone(), out_tx.clone(), subs.clone(), client_id.clone());
                        tokio::spawn(async move {
                            let ctx = Ctx::new(conn_id, client_id, subs);
                            let result = crate::methods::dispatch(&gw, &ctx, &req.method, &req.params).await;
                            let _ = out_tx.send(Out::Text(protocol::response(&req.id, result))).await;
                            ctx.fire_acks();
                        });
                    }
                }
            }
            ev = bus.recv() => {
                let ev = match ev {
                    Ok(ev) => ev,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(conn = conn_id, "closing a slow consumer: {n} events missed");
                        kill.cancel();
                        break;
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                };
                if !wanted(&ev, &subs) {
                    continue;
                }
                let frame_seq = match ev.audience {
                    Audience::All => { seq += 1; Some(seq) }
                    _ => None,
                };
                let frame = protocol::event_frame(ev.name, &ev.payload_json, frame_seq);
                if forward(&out_tx, frame, ev.droppable) == Forwarded::Close {
                    tracing::warn!(conn = conn_id, "closing a slow consumer: a {} event could not be queued", ev.name);
                    kill.cancel();
                    break;
                }
            }
            _ = tick.tick() => {
                seq += 1;
                let _ = out_tx.try_send(Out::Text(protocol::event("tick", &json!({"ts": pincer_store::ids::now_ms()}), Some(seq))));
            }
            _ = gw.shutdown.cancelled() => {
                seq += 1;
                let _ = out_tx.send(Out::Text(protocol::event("shutdown", &json!({"reason": "gateway stopping"}), Some(seq)))).await;
                let _ = out_tx.send(Out::Close(1012, "gateway stopping")).await;
                break;
            }
        }
    }
    drop(out_tx);
    let _ = writer.await;
}

/// What happened to an event frame on its way to a connection.
#[derive(Debug, PartialEq, Eq)]
enum Forwarded {
    Queued,
    /// The connection is behind and the event may be lost (a delta): skipped, its `seq` used.
    Dropped,
    /// The connection is behind and the event must not be lost (a final): close with 1008.
    Close,
}

fn forward(out: &mpsc::Sender<Out>, frame: String, droppable: bool) -> Forwarded {
    match out.try_send(Out::Text(frame)) {
        Ok(()) => Forwarded::Queued,
        Err(mpsc::error::TrySendError::Full(_)) if droppable => Forwarded::Dropped,
        Err(_) => Forwarded::Close,
    }
}

fn wanted(ev: &BusEvent, subs: &Subs) -> bool {
    match ev.audience {
        // Session streams go to the connections that work with that session.
        Audience::All => match &ev.session_key {
            Some(k) => crate::state::lock(&subs.chats).contains(k),
            None => true,
        },
        Audience::SessionsWatchers => subs.sessions.load(Ordering::Relaxed),
        Audience::SessionSubscribers => {
            ev.session_key.as_ref().is_some_and(|k| crate::state::lock(&subs.messages).contains(k))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_consumer_loses_deltas_but_never_a_final() {
        let (tx, mut rx) = mpsc::channel::<Out>(2);
        assert_eq!(forward(&tx, "a".into(), true), Forwarded::Queued);
        assert_eq!(forward(&tx, "b".into(), false), Forwarded::Queued);
        assert_eq!(forward(&tx, "delta".into(), true), Forwarded::Dropped, "full: a delta is skipped");
        assert_eq!(forward(&tx, "final".into(), false), Forwarded::Close, "full: a final closes the socket");
        let _ = rx.try_recv();
        assert_eq!(forward(&tx, "final".into(), false), Forwarded::Queued, "room again");
    }

    #[test]
    fn auth_accepts_token_or_password_and_names_the_problem() {
        let mode = AuthMode::Token("s3cret".into());
        assert!(check_auth(&mode, &json!({"auth": {"token": "s3cret"}})).is_ok());
        assert!(check_auth(&mode, &json!({"auth": {"token": "x", "password": "s3cret"}})).is_ok());
        let e = check_auth(&mode, &json!({"auth": {"token": "nope"}})).expect_err("mismatch");
        assert_eq!(e.details.as_deref(), Some(&json!({"code": "AUTH_TOKEN_MISMATCH"})));
        let e = check_auth(&mode, &json!({})).expect_err("missing");
        assert_eq!(e.details.as_deref(), Some(&json!({"code": "AUTH_TOKEN_MISSING"})));
        assert!(check_auth(&AuthMode::None, &json!({})).is_ok());
        assert!(!same_secret("abc", "abd") && same_secret("abc", "abc") && !same_secret("abc", "abcd"));
    }
}
