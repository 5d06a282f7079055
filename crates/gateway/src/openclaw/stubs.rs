//! Well-formed empty answers, in OpenClaw 2026.9.6's result shapes, for features Pincer does not
//! have (cron, channels, skills, plugins, tasks, artifacts, questions, progress cards, heartbeats,
//! diagnostics lanes, plugin approvals, the session companion, talk, paired devices and nodes): the Control UI and the CLI then show "none" instead of an error. Each is a
//! `Method` (so `hello-ok` lists it) because it really answers.

use crate::protocol::Method;
use serde_json::{json, Value};

/// The empty answer of a method this module serves, `None` for any other.
pub fn answer(method: Method) -> Option<Value> {
    let now = pincer_pi::now_ms();
    Some(match method {
        // The CLI pages with `snapshotRevision` and refuses a page without it.
        Method::CronList => json!({"jobs": [], "snapshotRevision": "none", "total": 0, "offset": 0, "limit": 50,
            "hasMore": false, "nextOffset": null}),
        Method::CronStatus => json!({"enabled": false, "jobs": 0, "nextWakeAtMs": null}),
        Method::CronRuns => {
            json!({"entries": [], "total": 0, "offset": 0, "limit": 50, "hasMore": false, "nextOffset": null})
        }
        Method::ChannelsStatus => json!({"ts": now, "channelOrder": [], "channelLabels": {}, "channels": {},
            "channelAccounts": {}, "channelDefaultAccountId": {}}),
        Method::ChannelsPairingList => json!({"accounts": [], "requests": [], "commandOwnerConfigured": false,
            "limits": {"pendingPerAccount": 0, "ttlMs": 0}}),
        Method::SkillsStatus => json!({"workspaceDir": "", "managedSkillsDir": "", "skills": []}),
        Method::SkillsSearch => json!({"results": []}),
        Method::SkillsLibraryList => json!({"skills": []}),
        Method::PluginsList => json!({"plugins": [], "diagnostics": [], "mutationAllowed": false}),
        Method::TasksList => json!({"tasks": []}),
        Method::ArtifactsList => json!({"artifacts": []}),
        Method::QuestionList => json!({"questions": []}),
        Method::ProgressCardGet => json!({"card": null}),
        Method::LastHeartbeat => Value::Null,
        Method::DiagnosticsLanes => json!({"ts": now, "lanes": []}),
        // Approvals of plugins and system agents: the UI reads plain arrays (Pincer has neither;
        // exec approvals are real: `crate::approvals`).
        Method::PluginApprovalList | Method::OpenclawApprovalList => json!([]),
        Method::SessionsObserverVisibility => json!({"ok": true}),
        Method::SessionsCompanionState => json!({"exchanges": []}),
        Method::TalkCatalog => {
            let none = json!({"ready": false, "providers": []});
            json!({"modes": [], "transports": [], "brains": [], "speech": none, "transcription": none, "realtime": none})
        }
        // Device pairing is the token's job here, and Pincer drives no nodes.
        Method::DevicePairList => json!({"pending": [], "paired": []}),
        Method::NodeList => json!({"ts": now, "nodes": []}),
        _ => return None,
    })
}
