//! Decoding a method's params into its struct, with OpenClaw's wording of what was wrong, and the
//! small parameter types that check themselves (not blank, bounded, short text).

use crate::{Method, RpcError};
use serde_json::Value;

/// Decodes a method's params into its struct: a missing, mistyped or empty field is refused naming
/// the method and the field, as OpenClaw words it (`invalid sessions.rewind params: at /entryId:
/// must not be empty`). Fields the struct does not know are ignored (clients send `agentId` and
/// other extras); unknown top-level frame keys are refused earlier.
pub fn params<T: serde::de::DeserializeOwned>(method: Method, params: &Value) -> Result<T, RpcError> {
    serde_path_to_error::deserialize(params).map_err(|e| {
        let at = e.path().to_string();
        let why = e.into_inner().to_string();
        let why = why.split(" at line ").next().unwrap_or(&why).to_owned();
        match at.as_str() {
            "." | "" => RpcError::invalid(format!("invalid {} params: {why}", method.name())),
            path => {
                RpcError::invalid(format!("invalid {} params: at /{}: {why}", method.name(), path.replace('.', "/")))
            }
        }
    })
}

/// For `Option<Option<T>>` fields with `#[serde(default)]`: absent is `None`, `null` is
/// `Some(None)`, a value is `Some(Some(v))`.
pub fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A required string parameter that is not blank, trimmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonBlank(pub String);

impl<'de> serde::Deserialize<'de> for NonBlank {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        match s.trim() {
            "" => Err(serde::de::Error::custom("must not be empty")),
            t => Ok(NonBlank(t.to_owned())),
        }
    }
}

impl std::ops::Deref for NonBlank {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

/// An integer parameter within `MIN..=MAX`; anything else is refused as "must be an integer from
/// MIN to MAX".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounded<const MIN: u64, const MAX: u64>(pub u64);

impl<'de, const MIN: u64, const MAX: u64> serde::Deserialize<'de> for Bounded<MIN, MAX> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match <Value as serde::Deserialize>::deserialize(d)?.as_u64() {
            Some(n) if (MIN..=MAX).contains(&n) => Ok(Bounded(n)),
            _ => Err(serde::de::Error::custom(format!("must be an integer from {MIN} to {MAX}"))),
        }
    }
}

/// A short text parameter (a label, a level name, a model id): not blank, at most `MAX`
/// characters, no control characters or null bytes. Kept as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text<const MAX: usize>(pub String);

impl<'de, const MAX: usize> serde::Deserialize<'de> for Text<MAX> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let s = <String as serde::Deserialize>::deserialize(d)?;
        if s.trim().is_empty() {
            Err(D::Error::custom("must not be empty"))
        } else if s.chars().count() > MAX {
            Err(D::Error::custom(format!("must be at most {MAX} characters")))
        } else if s.chars().any(char::is_control) {
            Err(D::Error::custom("must not contain control characters or null bytes"))
        } else {
            Ok(Text(s))
        }
    }
}

impl<const MAX: usize> std::ops::Deref for Text<MAX> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}
