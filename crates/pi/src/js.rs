//! JavaScript semantics Pi's code depends on: string `.length` in UTF-16 code units,
//! `JSON.stringify` output (number formatting, key order), `String(v)` (template literals and `+`),
//! `Object.entries` order, default `Array.prototype.sort` order (UTF-16 code units) and truthiness.

use serde_json::{Map, Value};

/// `s.length` in JavaScript: UTF-16 code units (a character outside the BMP counts 2).
pub fn utf16_len(s: &str) -> usize {
    // Every char counts 1; 4-byte UTF-8 sequences (outside the BMP) count one more.
    let bytes = s.as_bytes();
    let mut n = 0usize;
    for &b in bytes {
        if b & 0xC0 != 0x80 {
            n += 1;
        }
        if b >= 0xF0 {
            n += 1;
        }
    }
    n
}

/// The longest prefix of `s` with at most `units` UTF-16 code units. JavaScript's `slice` can cut a
/// surrogate pair in half; Rust strings cannot hold half a pair, so the pair is left out whole.
pub fn utf16_prefix(s: &str, units: usize) -> &str {
    let mut count = 0usize;
    for (i, c) in s.char_indices() {
        let w = c.len_utf16();
        if count + w > units {
            return &s[..i];
        }
        count += w;
    }
    s
}

/// JavaScript truthiness of a JSON value.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// `String(v)`, as a template literal or `"" + v` prints a value read from JSON (`None` is
/// `undefined`): arrays are joined with `,` (`null` elements empty), objects are `[object Object]`.
pub fn to_js_string(v: Option<&Value>) -> String {
    match v {
        None => "undefined".into(),
        Some(Value::Null) => "null".into(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => number_string(n),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| if x.is_null() { String::new() } else { to_js_string(Some(x)) })
            .collect::<Vec<_>>()
            .join(","),
        Some(Value::Object(_)) => "[object Object]".into(),
    }
}

/// Is `k` an array index (`0`..`2^32-2` in canonical form)? JavaScript enumerates such keys first,
/// in ascending numeric order, whatever order they were inserted in.
fn array_index(k: &str) -> Option<u32> {
    if k.is_empty() || k.len() > 10 || (k.len() > 1 && k.starts_with('0')) || !k.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    k.parse::<u64>().ok().filter(|&n| n < u32::MAX as u64).map(|n| n as u32)
}

/// `Object.entries(obj)` order: array-index keys ascending, then the other keys in insertion order.
pub fn js_entries(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut idx: Vec<(u32, &String, &Value)> = Vec::new();
    let mut rest: Vec<(&String, &Value)> = Vec::with_capacity(m.len());
    for (k, v) in m {
        match array_index(k) {
            Some(n) => idx.push((n, k, v)),
            None => rest.push((k, v)),
        }
    }
    if idx.is_empty() {
        return rest;
    }
    idx.sort_by_key(|e| e.0);
    idx.into_iter().map(|(_, k, v)| (k, v)).chain(rest).collect()
}

/// `JSON.stringify(v)` (compact, JavaScript number formatting and key order).
pub fn stringify(v: &Value) -> String {
    let mut out = String::new();
    write_json(v, &mut out);
    out
}

fn write_str(s: &str, out: &mut String) {
    // serde_json escapes exactly what JSON.stringify escapes (`"`, `\`, control characters with
    // the short forms \b \f \n \r \t and lowercase \u00xx otherwise).
    match serde_json::to_string(s) {
        Ok(q) => out.push_str(&q),
        Err(_) => out.push_str("\"\""),
    }
}

fn write_json(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number_string(n)),
        Value::String(s) => write_str(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in js_entries(m).into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(k, out);
                out.push(':');
                write_json(x, out);
            }
            out.push('}');
        }
    }
}

/// A JSON number as JavaScript prints it (`JSON.parse` reads every number as a double).
pub fn number_string(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) => js_number(f),
        None => n.to_string(),
    }
}

/// A double as the JSON number JavaScript would write: integral values without a fraction
/// (`1` not `1.0`), non-finite ones as `null`.
pub fn number_value(x: f64) -> Value {
    if x.is_finite() && x.fract() == 0.0 && x.abs() < 9_007_199_254_740_992.0 {
        // Exact: |x| < 2^53 and integral.
        #[allow(clippy::cast_possible_truncation)]
        Value::from(x as i64)
    } else {
        serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
    }
}

/// `Number.prototype.toString()` for a double (ECMA-262 `Number::toString`).
pub fn js_number(f: f64) -> String {
    if f.is_nan() || f.is_infinite() {
        return "null".into();
    }
    if f == 0.0 {
        return "0".into();
    }
    let sign = if f < 0.0 { "-" } else { "" };
    // `{:e}` gives the shortest round-trip digits: "d.ddde<exp>".
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = match sci.split_once('e') {
        Some(p) => p,
        None => return sci,
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let exp: i64 = exp.parse().unwrap_or(0);
    let k = digits.len() as i64;
    let n = exp + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let es = if e >= 0 { format!("+{e}") } else { e.to_string() };
        if k == 1 {
            format!("{digits}e{es}")
        } else {
            format!("{}.{}e{es}", &digits[..1], &digits[1..])
        }
    };
    format!("{sign}{body}")
}

/// JavaScript's default sort order for strings: by UTF-16 code units.
pub fn js_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn lengths_are_utf16_units() {
        assert_eq!(utf16_len("abcde"), 5);
        assert_eq!(utf16_len("é😀"), 3);
        assert_eq!(utf16_prefix("a😀b", 2), "a");
        assert_eq!(utf16_prefix("a😀b", 3), "a😀");
        assert_eq!(utf16_prefix("abc", 10), "abc");
    }

    #[test]
    fn numbers_print_like_javascript() {
        let cases = [
            (1.0, "1"),
            (-1.5, "-1.5"),
            (0.1, "0.1"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (0.000001, "0.000001"),
            (123456789.125, "123456789.125"),
            (12345678901234567890.0, "12345678901234567000"),
            (-0.0, "0"),
        ];
        let got: Vec<(f64, String)> = cases.iter().map(|(f, _)| (*f, js_number(*f))).collect();
        let want: Vec<(f64, String)> = cases.iter().map(|(f, s)| (*f, s.to_string())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn stringify_matches_json_stringify() {
        let v: Value = serde_json::from_str(r#"{"b":1.0,"2":"x","a":[1e21,null,true],"1":{"q":"\n\u0001é"}}"#).unwrap();
        assert_eq!(stringify(&v), r#"{"1":{"q":"\n\u0001é"},"2":"x","b":1,"a":[1e+21,null,true]}"#);
        assert_eq!(stringify(&json!({"path": "a.ts"})), r#"{"path":"a.ts"}"#);
    }

    #[test]
    fn string_conversion_is_javascripts() {
        let v: Value = serde_json::from_str(r#"[null, true, 2.0, 1e21, "s", [1, null, [2, 3]], {"a": 1}]"#).unwrap();
        let got: Vec<String> = v.as_array().unwrap().iter().map(|x| to_js_string(Some(x))).collect();
        assert_eq!(got, ["null", "true", "2", "1e+21", "s", "1,,2,3", "[object Object]"]);
        assert_eq!(to_js_string(None), "undefined");
        assert_eq!(number_value(3.0), json!(3));
        assert_eq!(number_value(0.5), json!(0.5));
        assert_eq!(number_value(f64::NAN), Value::Null);
    }

    #[test]
    fn sort_is_by_utf16_units() {
        // U+FF5E sorts after U+1F600 in code points but before it in UTF-16 units (0xD83D).
        let mut v = vec!["😀", "～", "a"];
        v.sort_by(|a, b| js_cmp(a, b));
        assert_eq!(v, vec!["a", "😀", "～"]);
    }
}
