//! The OpenClaw gateway wire protocol: request/response/event frames, the error shape and codes,
//! request validation (unknown top-level keys are refused, as TypeBox's `additionalProperties:false`
//! does), and the limits the server advertises.

use serde_json::{json, Map, Value};

/// Largest frame after the handshake (32 MiB): room for the documented 20 MB of attachments as
/// base64 (×4/3 ≈ 26.7 MB) plus the message and the frame around them.
pub const MAX_PAYLOAD_BYTES: usize = 32 * 1024 * 1024;
/// Largest frame before `connect` succeeded (64 KiB).
pub const MAX_PREAUTH_PAYLOAD_BYTES: usize = 64 * 1024;
/// Per-connection send buffer before a slow consumer is dropped/closed (50 MiB).
pub const MAX_BUFFERED_BYTES: usize = 50 * 1024 * 1024;
/// Sessions one connection may follow at once: worked with (`chat` and `agent` events), and
/// subscribed to (`sessions.messages.subscribe`), each. Beyond it the request is refused.
pub const MAX_SESSIONS_PER_CONNECTION: usize = 4096;
/// `tick` period.
pub const TICK_INTERVAL_MS: u64 = 30_000;
/// Time allowed for `connect` after the socket opens.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// Protocol versions spoken.
pub const PROTOCOL_MIN: u64 = 3;
pub const PROTOCOL_MAX: u64 = 4;

/// The RPC methods served: the one list (`hello-ok` advertises [`Method::ALL`]; the dispatcher
/// matches every variant, so a method cannot be listed without being served, or the reverse).
macro_rules! methods {
    ($($variant:ident = $name:literal,)*) => {
        /// An RPC method by name.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Method { $($variant,)* }

        impl Method {
            /// Every method, in the order `hello-ok` lists them.
            pub const ALL: &'static [Method] = &[$(Method::$variant,)*];

            /// The wire name.
            pub fn name(self) -> &'static str {
                match self { $(Method::$variant => $name,)* }
            }

            /// The method of a wire name.
            pub fn parse(name: &str) -> Option<Method> {
                match name { $($name => Some(Method::$variant),)* _ => None }
            }
        }
    };
}

methods! {
    Connect = "connect",
    Health = "health",
    ChatSend = "chat.send",
    ChatStartup = "chat.startup",
    ChatHistory = "chat.history",
    ChatAbort = "chat.abort",
    ChatInject = "chat.inject",
    SessionsList = "sessions.list",
    SessionsCreate = "sessions.create",
    SessionsPatch = "sessions.patch",
    SessionsReset = "sessions.reset",
    SessionsDelete = "sessions.delete",
    SessionsCompact = "sessions.compact",
    SessionsAbort = "sessions.abort",
    SessionsSubscribe = "sessions.subscribe",
    SessionsUnsubscribe = "sessions.unsubscribe",
    SessionsMessagesSubscribe = "sessions.messages.subscribe",
    SessionsMessagesUnsubscribe = "sessions.messages.unsubscribe",
    AgentsList = "agents.list",
    AgentIdentityGet = "agent.identity.get",
    ModelsList = "models.list",
    ChatMessageGet = "chat.message.get",
    SessionsBranchesList = "sessions.branches.list",
    SessionsBranchesSwitch = "sessions.branches.switch",
    SessionsRewind = "sessions.rewind",
    SessionsFork = "sessions.fork",
    SessionsTree = "sessions.tree",
    SessionsLabel = "sessions.label",
    SessionsArchivesList = "sessions.archives.list",
    SessionsArchivesGet = "sessions.archives.get",
    SessionsArchivesRestore = "sessions.archives.restore",
    SessionsSearch = "sessions.search",
    SessionsExport = "sessions.export",
    PincerInfo = "pincer.info",
    ToolsEffective = "tools.effective",
    Agent = "agent",
    AgentWait = "agent.wait",
    Status = "status",
    SystemPresence = "system-presence",
    LogsTail = "logs.tail",
    SessionsDescribe = "sessions.describe",
    CommandsList = "commands.list",
    SessionsUsage = "sessions.usage",
    UsageStatus = "usage.status",
    ChatMetadata = "chat.metadata",
    ModelsAuthStatus = "models.authStatus",
    ConfigGet = "config.get",
    ThemesList = "themes.list",
    UpdateStatus = "update.status",
    CronList = "cron.list",
    CronStatus = "cron.status",
    CronRuns = "cron.runs",
    ChannelsStatus = "channels.status",
    ChannelsPairingList = "channels.pairing.list",
    SkillsStatus = "skills.status",
    SkillsSearch = "skills.search",
    SkillsLibraryList = "skills.library.list",
    PluginsList = "plugins.list",
    TasksList = "tasks.list",
    ArtifactsList = "artifacts.list",
    QuestionList = "question.list",
    ProgressCardGet = "progressCard.get",
    LastHeartbeat = "last-heartbeat",
    DiagnosticsLanes = "diagnostics.lanes",
    ExecApprovalList = "exec.approval.list",
    ExecApprovalGet = "exec.approval.get",
    ExecApprovalResolve = "exec.approval.resolve",
    ApprovalResolve = "approval.resolve",
    PluginApprovalList = "plugin.approval.list",
    OpenclawApprovalList = "openclaw.approval.list",
    SessionsObserverVisibility = "sessions.observer.visibility",
    SessionsCompanionState = "sessions.companion.state",
    TalkCatalog = "talk.catalog",
    DevicePairList = "device.pair.list",
    NodeList = "node.list",
}

impl Method {
    /// The names, for `hello-ok`'s `features.methods`.
    pub fn names() -> Vec<&'static str> {
        Method::ALL.iter().map(|m| m.name()).collect()
    }

    /// Methods about one session: the connection calling them hears that session's `chat` and
    /// `agent` events from then on.
    pub fn joins_session(self) -> bool {
        matches!(
            self,
            Method::ChatSend
                | Method::ChatHistory
                | Method::ChatStartup
                | Method::ChatInject
                | Method::ChatAbort
                | Method::SessionsMessagesSubscribe
                | Method::SessionsCompact
                | Method::ChatMessageGet
                | Method::SessionsBranchesSwitch
                | Method::SessionsRewind
        )
    }
}

impl Method {
    /// Methods about approvals: they need `operator.approvals` (or `operator.admin`).
    pub fn approves(self) -> bool {
        matches!(
            self,
            Method::ExecApprovalList | Method::ExecApprovalGet | Method::ExecApprovalResolve | Method::ApprovalResolve
        )
    }

    /// Methods that change something (a transcript, the session index, a run): they need
    /// `operator.write`, so a client that asked for `[operator.read]` alone cannot call them.
    pub fn writes(self) -> bool {
        matches!(
            self,
            Method::ChatSend
                | Method::ChatAbort
                | Method::ChatInject
                | Method::Agent
                | Method::SessionsCreate
                | Method::SessionsPatch
                | Method::SessionsReset
                | Method::SessionsDelete
                | Method::SessionsCompact
                | Method::SessionsAbort
                | Method::SessionsBranchesSwitch
                | Method::SessionsRewind
                | Method::SessionsFork
                | Method::SessionsLabel
                | Method::SessionsArchivesRestore
        )
    }
}

/// Operator scopes `connect` may ask for.
pub const SCOPES: &[&str] =
    &["operator.admin", "operator.read", "operator.write", "operator.approvals", "operator.pairing"];

/// The scopes a token holder is granted: those it asked for (`operator.admin` brings read and
/// write, write brings read), or read and write when it asked for none.
pub fn granted_scopes(connect_params: &Value) -> Vec<&'static str> {
    let asked: Vec<&str> = (connect_params.get("scopes").and_then(Value::as_array).into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    let mut scopes: Vec<&'static str> = SCOPES.iter().copied().filter(|s| asked.contains(s)).collect();
    let implied: &[&'static str] = if asked.is_empty() || scopes.contains(&"operator.admin") {
        &["operator.read", "operator.write"]
    } else if scopes.contains(&"operator.write") {
        &["operator.read"]
    } else {
        &[]
    };
    for s in implied {
        if !scopes.contains(s) {
            scopes.push(s);
        }
    }
    scopes
}

/// Events emitted.
pub const EVENTS: &[&str] =
    &["connect.challenge", "tick", "chat", "agent", "session.message", "sessions.changed", "shutdown"];

/// An error in OpenClaw's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: &'static str,
    pub message: String,
    pub details: Option<Box<Value>>,
}

impl RpcError {
    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError { code: "INVALID_REQUEST", message: message.into(), details: None }
    }
    pub fn unavailable(message: impl Into<String>) -> RpcError {
        RpcError { code: "UNAVAILABLE", message: message.into(), details: None }
    }
    pub fn with_details(mut self, details: Value) -> RpcError {
        self.details = Some(Box::new(details));
        self
    }
    pub fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.details {
            e["details"] = (**d).clone();
        }
        e
    }
}

/// A parsed request frame.
#[derive(Debug, Clone)]
pub struct Request {
    pub id: String,
    pub method: String,
    pub params: Value,
}

/// Parses a text frame into a request. On error, the request's id as its JSON text (when one
/// could be read), for [`refusal`].
pub fn parse_request(text: &str) -> Result<Request, (Option<String>, RpcError)> {
    if text.contains('\u{0}') {
        return Err((None, RpcError::invalid("frame must not contain null bytes")));
    }
    let v: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            return Err(
                lone_surrogate(text).unwrap_or((None, RpcError::invalid(format!("frame is not valid JSON: {e}"))))
            )
        }
    };
    let Value::Object(obj) = v else {
        return Err((None, RpcError::invalid("frame must be a JSON object")));
    };
    let id = obj.get("id").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
    let fail = |msg: String| Err((id.as_ref().map(|i| Value::from(i.as_str()).to_string()), RpcError::invalid(msg)));
    if obj.get("type").and_then(Value::as_str) != Some("req") {
        return fail("frame type must be \"req\"".into());
    }
    let Some(id_s) = id.clone() else {
        return fail("request id must be a non-empty string".into());
    };
    let Some(method) = obj.get("method").and_then(Value::as_str).filter(|s| !s.is_empty()) else {
        return fail("request method must be a non-empty string".into());
    };
    if let Some(extra) = obj.keys().find(|k| !matches!(k.as_str(), "type" | "id" | "method" | "params" | "traceparent"))
    {
        return fail(format!("unexpected property '{extra}' in request frame"));
    }
    Ok(Request { id: id_s, method: method.to_owned(), params: obj.get("params").cloned().unwrap_or(Value::Null) })
}

/// The refusal of a frame that JavaScript's `JSON.parse` accepts but that is not valid Unicode:
/// a `\uD800`–`\uDFFF` escape without its other half (`JSON.stringify` writes them for a string
/// holding half a character). The error names the escape; the request's id is read from the frame
/// with those escapes replaced (same length, so the id's bytes in the frame are found), and is
/// answered as it was sent (so an id holding one comes back the same). `None` when the frame has
/// no lone surrogate or is not valid JSON for another reason too.
fn lone_surrogate(text: &str) -> Option<(Option<String>, RpcError)> {
    let b = text.as_bytes();
    let hex4 = |at: usize| -> Option<u32> {
        let h = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
        u32::from_str_radix(h, 16).ok()
    };
    let (mut lone, mut i, mut in_string) = (Vec::new(), 0, false);
    while i < b.len() {
        match (in_string, b[i]) {
            (false, b'"') | (true, b'"') => {
                in_string = !in_string;
                i += 1;
            }
            (true, b'\\') if b.get(i + 1) == Some(&b'u') => {
                let u = hex4(i + 2)?;
                let paired = (0xD800..0xDC00).contains(&u)
                    && b.get(i + 6..i + 8) == Some(b"\\u")
                    && hex4(i + 8).is_some_and(|l| (0xDC00..0xE000).contains(&l));
                if paired {
                    i += 12;
                    continue;
                }
                if (0xD800..0xE000).contains(&u) {
                    lone.push(i);
                }
                i += 6;
            }
            (true, b'\\') => i += 2,
            _ => i += 1,
        }
    }
    let first = *lone.first()?;
    let mut patched = b.to_vec();
    for &at in &lone {
        patched[at + 2..at + 6].copy_from_slice(b"fffd");
    }
    let patched = String::from_utf8(patched).ok()?;
    #[derive(serde::Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        id: Option<&'a serde_json::value::RawValue>,
    }
    let head: Id<'_> = serde_json::from_str(&patched).ok()?;
    let id = head.id.map(|raw| raw.get()).filter(|r| r.starts_with('"') && *r != "\"\"").map(|r| {
        let at = r.as_ptr() as usize - patched.as_ptr() as usize;
        text[at..at + r.len()].to_owned()
    });
    let escape = &text[first..first + 6];
    let msg = format!(
        "frame is not valid JSON text: the string escape {escape} at byte {first} is a lone surrogate (half of a \
         UTF-16 character without its other half); strings must be valid Unicode"
    );
    Some((id, RpcError::invalid(msg)))
}

/// The error response to a frame that is no request: `id` is the request's id as its JSON text
/// ([`parse_request`]'s), `fallback` the id used when it had none.
pub fn refusal(id: Option<&str>, fallback: &str, e: RpcError) -> String {
    match id {
        Some(id) => format!(r#"{{"type":"res","id":{id},"ok":false,"error":{}}}"#, e.to_json()),
        None => response(fallback, Err(e)),
    }
}

/// `{"type":"res",…}` as text.
pub fn response(id: &str, result: Result<Value, RpcError>) -> String {
    let frame = match result {
        Ok(payload) => json!({"type": "res", "id": id, "ok": true, "payload": payload}),
        Err(e) => json!({"type": "res", "id": id, "ok": false, "error": e.to_json()}),
    };
    frame.to_string()
}

/// `{"type":"event",…}` as text, with a frame `seq` for broadcast events.
pub fn event(name: &str, payload: &Value, seq: Option<u64>) -> String {
    let mut m = Map::new();
    m.insert("type".into(), json!("event"));
    m.insert("event".into(), json!(name));
    m.insert("payload".into(), payload.clone());
    if let Some(s) = seq {
        m.insert("seq".into(), json!(s));
    }
    Value::Object(m).to_string()
}

/// An event frame from an already serialized payload (the bus serializes each payload once).
pub fn event_frame(name: &str, payload_json: &str, seq: Option<u64>) -> String {
    use std::fmt::Write;
    let mut f = String::with_capacity(payload_json.len() + 64);
    f.push_str("{\"type\":\"event\",\"event\":");
    // Event names are dotted identifiers: written as they are, anything else escaped.
    if name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
        let _ = write!(f, "\"{name}\"");
    } else {
        f.push_str(&Value::from(name).to_string());
    }
    f.push_str(",\"payload\":");
    f.push_str(payload_json);
    if let Some(s) = seq {
        let _ = write!(f, ",\"seq\":{s}");
    }
    f.push('}');
    f
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Example {
        session_key: NonBlank,
        limit: Option<u32>,
    }

    #[test]
    fn params_name_the_method_and_the_field() {
        let m = Method::SessionsRewind;
        let err = |v: Value| params::<Example>(m, &v).map(|_| ()).unwrap_err().message;
        assert_eq!(err(json!({})), "invalid sessions.rewind params: missing field `sessionKey`");
        assert_eq!(
            err(json!({"sessionKey": "  "})),
            "invalid sessions.rewind params: at /sessionKey: must not be empty"
        );
        assert_eq!(
            err(json!({"sessionKey": 5})),
            "invalid sessions.rewind params: at /sessionKey: invalid type: integer `5`, expected a string"
        );
        assert_eq!(
            err(json!({"sessionKey": "main", "limit": -1})),
            "invalid sessions.rewind params: at /limit: invalid value: integer `-1`, expected u32"
        );
        let ok: Example = params(m, &json!({"sessionKey": " main ", "agentId": "x"})).unwrap();
        assert_eq!(&*ok.session_key, "main");
        // Every method has one name, and the names parse back.
        assert!(Method::ALL.iter().all(|m| Method::parse(m.name()) == Some(*m)));
        assert_eq!(Method::parse("nope"), None);
    }

    #[test]
    fn request_validation() {
        let r = parse_request(r#"{"type":"req","id":"1","method":"health"}"#).expect("valid");
        assert_eq!((r.id.as_str(), r.method.as_str(), r.params), ("1", "health", Value::Null));
        let (id, e) = parse_request(r#"{"type":"req","id":"2","method":"health","x":1}"#).expect_err("extra key");
        assert_eq!(id.as_deref(), Some(r#""2""#));
        assert_eq!(e.message, "unexpected property 'x' in request frame");
        assert!(parse_request("nope").is_err());
        assert!(parse_request(r#"{"type":"req","id":"","method":"m"}"#).is_err());
        assert!(parse_request("{\"type\":\"req\",\"id\":\"1\",\"method\":\"m\u{0}\"}").is_err());
        // Lone surrogates (JSON.parse takes them, Rust strings cannot hold them): refused with the
        // request's own id, as sent; a pair is a character and is fine.
        let (id, e) =
            parse_request(r#"{"type":"req","id":"7","method":"m","params":{"t":"a\ud800b"}}"#).expect_err("lone");
        assert_eq!(id.as_deref(), Some(r#""7""#));
        assert!(e.message.contains(r"\ud800 at byte 52 is a lone surrogate"), "{}", e.message);
        let (id, _) = parse_request(r#"{"params":"\\udc00\uDC00","id":"x\udc00\\","type":"req"}"#).expect_err("lone");
        assert_eq!(id.as_deref(), Some(r#""x\udc00\\""#));
        assert_eq!(
            refusal(id.as_deref(), "unknown", RpcError::invalid("bad")),
            r#"{"type":"res","id":"x\udc00\\","ok":false,"error":{"code":"INVALID_REQUEST","message":"bad"}}"#
        );
        let (id, _) =
            parse_request(r#"{"type":"req","id":"8","method":"m","params":{"t":"\ud800"},}"#).expect_err("bad");
        assert_eq!(id, None, "still not JSON with the surrogate replaced");
        let ok = parse_request(r#"{"type":"req","id":"9","method":"m","params":{"t":"\ud83d\ude00 \\ud800"}}"#);
        assert_eq!(ok.expect("a pair and an escaped backslash").params["t"], "\u{1F600} \\ud800");
        assert_eq!(
            response("9", Err(RpcError::invalid("bad"))),
            r#"{"type":"res","id":"9","ok":false,"error":{"code":"INVALID_REQUEST","message":"bad"}}"#
        );
        assert_eq!(
            event("tick", &json!({"ts": 1}), Some(3)),
            r#"{"type":"event","event":"tick","payload":{"ts":1},"seq":3}"#
        );
        assert_eq!(event_frame("tick", r#"{"ts":1}"#, Some(3)), event("tick", &json!({"ts": 1}), Some(3)));
        assert_eq!(event_frame("x", "{}", None), event("x", &json!({}), None));
        assert_eq!(event_frame("odd \"name\"", "{}", Some(1)), event("odd \"name\"", &json!({}), Some(1)));
    }
}
