//! The approval settings of an agent (`approval` and `approval_timeout` in
//! `[agents.defaults.tools]` / `[agents.<id>.tools]`): which tool calls wait for a person's
//! decision (the engine's `approvals` is the gate that asks).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long a request waits by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The tools asked about unless the config says otherwise.
pub const ASKED_BY_DEFAULT: &[&str] = &["bash", "write", "edit"];

/// What a tool call needs before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Runs.
    Allow,
    /// Waits for a human's decision (unless on the allow-always list).
    Ask,
    /// Never runs: the call gets an error result.
    Deny,
}

/// `approval` in `[agents.defaults.tools]` / `[agents.<id>.tools]`: one policy for every tool, or
/// a policy per tool name (the others keep their default).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ApprovalConfig {
    All(Policy),
    Each(BTreeMap<String, Policy>),
}

/// An agent's approval settings, resolved from its config.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentApprovals {
    /// One policy for every tool, when the config set one.
    pub all: Option<Policy>,
    /// A policy per tool.
    pub each: BTreeMap<String, Policy>,
    /// How long a request waits before it is denied.
    pub timeout: Duration,
}

impl Default for AgentApprovals {
    fn default() -> Self {
        AgentApprovals { all: None, each: BTreeMap::new(), timeout: DEFAULT_TIMEOUT }
    }
}

impl AgentApprovals {
    /// From the config's `approval` and `approval_timeout` (seconds); a tool name that does not
    /// exist is an error naming it.
    pub fn new(config: Option<&ApprovalConfig>, timeout_secs: Option<u64>) -> Result<AgentApprovals, String> {
        let mut a = AgentApprovals::default();
        match config {
            Some(ApprovalConfig::All(p)) => a.all = Some(*p),
            Some(ApprovalConfig::Each(each)) => {
                for name in each.keys() {
                    let mcp = name.starts_with(pincer_agent::mcp::PREFIX);
                    if !mcp && !pincer_agent::tools::BUILTIN_TOOLS.contains(&name.as_str()) {
                        return Err(format!(
                            "approval: unknown tool {name:?} (tools: {}, or an MCP tool mcp__<server>__<tool>)",
                            pincer_agent::tools::BUILTIN_TOOLS.join(", ")
                        ));
                    }
                }
                a.each = each.clone();
            }
            None => {}
        }
        if let Some(s) = timeout_secs {
            a.timeout = Duration::from_secs(s.max(1));
        }
        Ok(a)
    }

    /// The policy of tool `name`; `destructive` is the tool's own hint (`Tool::destructive`: an
    /// MCP tool its server does not say is read-only or harmless), asked about by default too.
    pub fn policy(&self, name: &str, destructive: bool) -> Policy {
        if let Some(p) = self.each.get(name).copied().or(self.all) {
            return p;
        }
        if destructive || ASKED_BY_DEFAULT.contains(&name) {
            Policy::Ask
        } else {
            Policy::Allow
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_asks_for_bash_write_and_edit_only() {
        let a = AgentApprovals::default();
        assert_eq!(a.policy("bash", false), Policy::Ask);
        assert_eq!(a.policy("write", false), Policy::Ask);
        assert_eq!(a.policy("read", false), Policy::Allow);
        let each = ApprovalConfig::Each([("bash".to_owned(), Policy::Allow)].into());
        let a = AgentApprovals::new(Some(&each), None).unwrap();
        assert_eq!((a.policy("bash", false), a.policy("edit", false)), (Policy::Allow, Policy::Ask));
        let a = AgentApprovals::new(Some(&ApprovalConfig::All(Policy::Deny)), Some(5)).unwrap();
        assert_eq!((a.policy("read", false), a.timeout), (Policy::Deny, Duration::from_secs(5)));
        let bad = ApprovalConfig::Each([("bsh".to_owned(), Policy::Allow)].into());
        assert!(AgentApprovals::new(Some(&bad), None).unwrap_err().contains("\"bsh\""));
    }

    #[test]
    fn an_mcp_tool_that_may_be_destructive_is_asked_about_unless_the_config_names_it() {
        let a = AgentApprovals::default();
        assert_eq!(a.policy("mcp__fs__write_file", true), Policy::Ask);
        assert_eq!(a.policy("mcp__fs__read_file", false), Policy::Allow);
        let each = ApprovalConfig::Each([("mcp__fs__write_file".to_owned(), Policy::Allow)].into());
        let a = AgentApprovals::new(Some(&each), None).unwrap();
        assert_eq!(
            (a.policy("mcp__fs__write_file", true), a.policy("mcp__fs__edit_file", true)),
            (Policy::Allow, Policy::Ask)
        );
        let a = AgentApprovals::new(Some(&ApprovalConfig::All(Policy::Allow)), None).unwrap();
        assert_eq!(a.policy("mcp__fs__write_file", true), Policy::Allow);
    }
}
