//! The slash commands a message may be (`/stop`, `/new`, `/compact`, `/status`, `/help`,
//! `/approve …`): the one list, which `chat.send`, channels and `commands.list` read.

/// A slash command `chat.send` answers itself: its name, the texts that invoke it, what it does,
/// and whether it takes an argument.
pub struct SlashCommand {
    pub name: &'static str,
    pub texts: &'static [&'static str],
    pub description: &'static str,
    pub accepts_args: bool,
}

/// The slash commands, the one list (`commands.list` reads it too). `stop` also answers a bare `stop`.
pub const SLASH_COMMANDS: &[SlashCommand] = &[
    SlashCommand {
        name: "stop",
        texts: &["/stop", "/abort", "/cancel"],
        description: "Stop the running turn",
        accepts_args: false,
    },
    SlashCommand {
        name: "new",
        texts: &["/new", "/reset"],
        description: "Start a new session (the transcript is archived)",
        accepts_args: false,
    },
    SlashCommand {
        name: "compact",
        texts: &["/compact"],
        description: "Summarise older turns to free context (optional focus)",
        accepts_args: true,
    },
    SlashCommand {
        name: "status",
        texts: &["/status"],
        description: "Show the session's model, size and usage",
        accepts_args: false,
    },
    SlashCommand { name: "help", texts: &["/help"], description: "List the commands", accepts_args: false },
];

pub fn is_stop(text: &str) -> bool {
    let t = text.trim().to_lowercase();
    t == "stop" || SLASH_COMMANDS[0].texts.contains(&t.as_str())
}

/// The arguments of an `/approve …` message.
pub fn approve_command(text: &str) -> Option<&str> {
    let t = text.trim();
    let rest = t.get(..8).filter(|p| p.eq_ignore_ascii_case("/approve")).map(|_| &t[8..])?;
    (rest.is_empty() || rest.starts_with(char::is_whitespace)).then_some(rest)
}

pub fn slash_command(text: &str) -> Option<&'static str> {
    let first = text.split_whitespace().next()?.to_lowercase();
    SLASH_COMMANDS.iter().skip(1).find(|c| c.texts.contains(&first.as_str())).map(|c| c.name)
}
