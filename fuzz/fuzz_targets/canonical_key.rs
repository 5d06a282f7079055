//! Session-key canonicalisation (`pincer_gateway::sessions::canonical_key`) over arbitrary keys.
//!
//! Properties of an accepted key `(key, agent)`:
//! - `key` is `agent:<agent>:<non-empty rest>` with a valid agent id (lowercase ASCII letters, digits,
//!   `_`, `-`; starts with a letter or digit; at most 64 bytes);
//! - it holds no `/`, `\` or control character, is not blank, and is lowercase;
//! - canonicalising is idempotent: the canonical key is accepted again and maps to itself (a key
//!   a client got back from `sessions.list` must address the same session);
//! - surrounding whitespace and ASCII letter case do not change the result.
//!
//! Refused keys give `INVALID_REQUEST` with a message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pincer_gateway::sessions::canonical_key;

fuzz_target!(|data: &[u8]| {
    let raw = String::from_utf8_lossy(data);
    match canonical_key(&raw) {
        Ok((key, agent)) => {
            let rest = key
                .strip_prefix("agent:")
                .and_then(|r| r.strip_prefix(agent.as_str()))
                .and_then(|r| r.strip_prefix(':'))
                .unwrap_or_else(|| panic!("{key:?} is not agent:{agent}:…"));
            assert!(!rest.is_empty(), "empty rest in {key:?}");
            let a = agent.as_str().as_bytes();
            assert!(!a.is_empty() && a.len() <= 64 && a[0].is_ascii_alphanumeric(), "agent id {agent:?}");
            assert!(
                a.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-')),
                "agent id {agent:?}"
            );
            assert!(!key.chars().any(|c| c.is_control() || c == '/' || c == '\\'), "bad character in {key:?}");
            assert_eq!(key.to_lowercase(), key, "not lowercase");
            assert_eq!(key.trim(), key, "surrounding whitespace");

            let again = canonical_key(&key).unwrap_or_else(|e| panic!("canonical key {key:?} refused: {e}"));
            assert_eq!(again, (key.clone(), agent.clone()), "not idempotent");

            let upper = format!("  {}\t", raw.to_uppercase());
            if raw.is_ascii() {
                // ASCII only: beyond it, upper-casing first can change what NFKC folds to (a key is
                // still folded to one fixed point, which the idempotency check above holds).
                if let Ok(u) = canonical_key(&upper) {
                    assert_eq!(u, (key, agent), "case or whitespace changed the key");
                }
            }
        }
        Err(e) => {
            assert!(matches!(e, pincer_gateway::error::EngineError::Invalid(_)), "{e:?}");
            assert!(!e.to_string().is_empty());
        }
    }
});
