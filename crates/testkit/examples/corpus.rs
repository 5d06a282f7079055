//! Writes the generated search corpus ([`pincer_testkit::corpus`]) into a state directory and
//! prints the planted hits as JSON lines: `corpus STATE_DIR SESSIONS ENTRIES` (for the browser
//! test of the WebChat's search and for benchmarks).

#![allow(clippy::print_stdout)] // its output is the planted hits

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, sessions, entries] = args.as_slice() else {
        eprintln!("usage: corpus STATE_DIR SESSIONS ENTRIES");
        std::process::exit(2);
    };
    let (Ok(sessions), Ok(entries)) = (sessions.parse(), entries.parse()) else {
        eprintln!("SESSIONS and ENTRIES are numbers");
        std::process::exit(2);
    };
    let c = pincer_testkit::corpus::generate(std::path::Path::new(dir), sessions, entries);
    for p in c.planted {
        let line = serde_json::json!({"query": p.query, "sessionKey": p.session_key, "sessionId": p.session_id,
            "entryId": p.entry_id, "offBranch": p.off_branch, "archived": p.archived});
        println!("{line}");
    }
}
