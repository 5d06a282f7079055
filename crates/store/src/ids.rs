//! Entry and session ids, and the timestamps written into entries.

/// A new entry id: a full UUID, so no file-wide collision check is needed (readers accept any string).
pub fn new_entry_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// An 8-hex id as Pi writes them (used for in-memory v1 migration, as Pi does).
pub fn short_id() -> String {
    let u = uuid::Uuid::new_v4();
    u.simple().to_string()[..8].to_string()
}

/// A new session id (uuid v7, as Pi 0.73 writes).
pub fn new_session_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// `new Date().toISOString()`.
pub fn now_iso() -> String {
    iso(chrono::Utc::now())
}

/// `Date.prototype.toISOString()`: `2026-01-31T12:00:00.123Z`.
fn iso(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `new Date(value).getTime()` for the values an entry's `timestamp` holds: ISO strings (with or
/// without fraction or offset, date-only) and numbers. `None` is JavaScript's `NaN`.
pub fn js_date_ms(v: Option<&serde_json::Value>) -> Option<i64> {
    use chrono::{DateTime, NaiveDate, NaiveDateTime};
    match v? {
        serde_json::Value::Number(n) => n.as_f64().filter(|f| f.is_finite()).map(|f| f.trunc() as i64),
        serde_json::Value::String(s) => {
            let s = s.trim();
            if let Ok(d) = DateTime::parse_from_rfc3339(s) {
                return Some(d.timestamp_millis());
            }
            for fmt in ["%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"] {
                if let Ok(d) = NaiveDateTime::parse_from_str(s, fmt) {
                    return Some(d.and_utc().timestamp_millis());
                }
            }
            NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
                .map(|d| d.and_utc().timestamp_millis())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timestamps_are_written_as_to_iso_string_writes_them() {
        for (ms, want) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (1_767_225_600_007, "2026-01-01T00:00:00.007Z"),
            (1_796_169_599_999, "2026-12-01T23:59:59.999Z"),
            (253_402_300_799_000, "9999-12-31T23:59:59.000Z"),
        ] {
            let t = chrono::DateTime::from_timestamp_millis(ms).unwrap();
            assert_eq!(iso(t), want);
            assert_eq!(js_date_ms(Some(&json!(iso(t)))), Some(ms), "reads back");
        }
        assert!(now_iso().ends_with('Z') && now_iso().len() == 24);
    }

    #[test]
    fn js_dates() {
        assert_eq!(js_date_ms(Some(&json!("2025-02-02T09:00:05.000Z"))), Some(1738486805000));
        assert_eq!(js_date_ms(Some(&json!("2025-02-02T10:00:05+01:00"))), Some(1738486805000));
        assert_eq!(js_date_ms(Some(&json!(17))), Some(17));
        assert_eq!(js_date_ms(Some(&json!("nope"))), None);
        assert_eq!(js_date_ms(None), None);
        assert_eq!(short_id().len(), 8);
        assert_eq!(now_iso().len(), 24);
    }
}
