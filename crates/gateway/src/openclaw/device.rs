//! Device identity in `connect`: when a client sends a `device` block, its Ed25519 signature is
//! verified (payload v3 `v3|deviceId|clientId|clientMode|role|scopes|signedAtMs|token|nonce|platform|deviceFamily`,
//! or the older v2 without the last two fields), the device id must be the SHA-256 of the public key,
//! and the nonce must be the one this connection's challenge carried.

use base64::Engine as _;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Why a device block was refused (OpenClaw's `details.code`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceError {
    pub code: &'static str,
    pub message: &'static str,
}

fn err(code: &'static str, message: &'static str) -> DeviceError {
    DeviceError { code, message }
}

fn b64url(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).ok()
}

/// ASCII-lowercased, trimmed platform metadata, as OpenClaw normalises it for signing.
fn norm(v: Option<&str>) -> String {
    v.map(|s| s.trim().to_ascii_lowercase()).unwrap_or_default()
}

/// Verifies `params.device` against the challenge nonce. `Ok(None)` when there is no device block.
pub fn verify(params: &Value, nonce: &str) -> Result<Option<String>, DeviceError> {
    let Some(device) = params.get("device").filter(|d| !d.is_null()) else {
        return Ok(None);
    };
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let id = s(device, "id").ok_or_else(|| err("DEVICE_AUTH_DEVICE_ID_MISMATCH", "device id missing"))?;
    let key = s(device, "publicKey")
        .and_then(|k| b64url(&k))
        .and_then(|raw| <[u8; 32]>::try_from(raw.as_slice()).ok())
        .ok_or_else(|| err("DEVICE_AUTH_PUBLIC_KEY_INVALID", "device public key invalid"))?;
    let fingerprint: String = Sha256::digest(key).iter().map(|b| format!("{b:02x}")).collect();
    if fingerprint != id.to_ascii_lowercase() {
        return Err(err("DEVICE_AUTH_DEVICE_ID_MISMATCH", "device identity mismatch"));
    }
    if s(device, "nonce").as_deref() != Some(nonce) {
        return Err(err("DEVICE_AUTH_NONCE_MISMATCH", "device nonce mismatch"));
    }
    let sig = s(device, "signature")
        .and_then(|g| b64url(&g))
        .and_then(|raw| Signature::from_slice(&raw).ok())
        .ok_or_else(|| err("DEVICE_AUTH_SIGNATURE_INVALID", "device signature invalid"))?;
    let vk = VerifyingKey::from_bytes(&key)
        .map_err(|_| err("DEVICE_AUTH_PUBLIC_KEY_INVALID", "device public key invalid"))?;
    let signed_at = device.get("signedAt").and_then(Value::as_i64).unwrap_or(0);
    let client = params.get("client").cloned().unwrap_or(Value::Null);
    let scopes: Vec<&str> = params
        .get("scopes")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let token = params.get("auth").and_then(|a| a.get("token")).and_then(Value::as_str).unwrap_or("");
    let base = [
        id.as_str(),
        client.get("id").and_then(Value::as_str).unwrap_or(""),
        client.get("mode").and_then(Value::as_str).unwrap_or(""),
        params.get("role").and_then(Value::as_str).unwrap_or("operator"),
        &scopes.join(","),
        &signed_at.to_string(),
        token,
        nonce,
    ]
    .join("|");
    let v3 = format!(
        "v3|{base}|{}|{}",
        norm(client.get("platform").and_then(Value::as_str)),
        norm(client.get("deviceFamily").and_then(Value::as_str))
    );
    let v2 = format!("v2|{base}");
    if vk.verify(v3.as_bytes(), &sig).is_ok() || vk.verify(v2.as_bytes(), &sig).is_ok() {
        Ok(Some(id))
    } else {
        Err(err("DEVICE_AUTH_SIGNATURE_INVALID", "device signature invalid"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};
    use serde_json::json;

    fn params(sk: &SigningKey, version: &str, nonce: &str, tamper: bool) -> Value {
        let pk = sk.verifying_key().to_bytes();
        let id: String = Sha256::digest(pk).iter().map(|b| format!("{b:02x}")).collect();
        let mut payload = format!(
            "{version}|{id}|openclaw-control-ui|webchat|operator|operator.read,operator.write|1700|tok|{nonce}"
        );
        if version == "v3" {
            payload.push_str("|linux x86_64|");
        }
        if tamper {
            payload.push('!');
        }
        let sig = sk.sign(payload.as_bytes()).to_bytes();
        let enc = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        json!({"client": {"id": "openclaw-control-ui", "mode": "webchat", "platform": " Linux x86_64 "},
            "role": "operator", "scopes": ["operator.read", "operator.write"], "auth": {"token": "tok"},
            "device": {"id": id, "publicKey": enc(&pk), "signature": enc(&sig), "signedAt": 1700, "nonce": nonce}})
    }

    #[test]
    fn v2_and_v3_signatures() {
        let sk = SigningKey::from_bytes(&[7u8; 32]);
        assert!(verify(&params(&sk, "v3", "n1", false), "n1").expect("v3").is_some());
        assert!(verify(&params(&sk, "v2", "n1", false), "n1").expect("v2").is_some());
        assert_eq!(
            verify(&params(&sk, "v3", "n1", true), "n1").expect_err("tampered").code,
            "DEVICE_AUTH_SIGNATURE_INVALID"
        );
        assert_eq!(
            verify(&params(&sk, "v3", "n1", false), "n2").expect_err("nonce").code,
            "DEVICE_AUTH_NONCE_MISMATCH"
        );
        let mut p = params(&sk, "v3", "n1", false);
        p["device"]["id"] = json!("00");
        assert_eq!(verify(&p, "n1").expect_err("id").code, "DEVICE_AUTH_DEVICE_ID_MISMATCH");
        assert_eq!(verify(&json!({}), "n1"), Ok(None));
    }
}
