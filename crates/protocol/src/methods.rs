//! The method table: every RPC method served, by name, with its flags (writes, joins a session,
//! approves), and the operator scopes a `connect` may be granted.

use serde_json::Value;

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
