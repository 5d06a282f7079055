//! Pi's file tools through the real gateway: a scripted OpenAI-compatible fake asks for `read`,
//! `write`, `edit`, `ls`, `find` and `grep` with Pi's parameter shapes, several in one assistant
//! message. The rows on disk have Pi's shapes and are chained in the message's call order; the files
//! in the workspace change as the calls say (and not when a call is refused: an `edit` whose
//! `oldText` is not unique, a path leading outside the workspace); and the real Pi library's context
//! of the file, in OpenAI's wire form, is exactly what the provider received on its next call.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_provider::{script, text, tool_call, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::{refused_startup, Client, GatewayProcess};
use pincer_testkit::wire::{check_request_against_pi, result_text, tool_results};
use pretty_assertions::assert_eq;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

/// A 1x1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4, 0x89, 0x00, 0x00, 0x00, 0x0D, 0x49,
    0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0x00, 0x01, 0x00, 0x00, 0x05, 0x00, 0x01, 0x0D, 0x0A, 0x2D, 0xB4, 0x00, 0x00,
    0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
];

fn config(fake: &FakeProvider, workspace: &Path, tools: &str) -> String {
    format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
         [[models.providers.fake.models]]\nid = \"gpt-test\"\ncontext_window = 1000000\n\
         [agents.defaults]\nmodel = \"fake/gpt-test\"\nworkspace = \"{}\"\n{tools}",
        fake.base_url(),
        workspace.display()
    )
}

/// A tool call part with its arguments as one JSON chunk.
fn call(id: &str, name: &str, args: Value) -> pincer_testkit::fake_provider::Part {
    tool_call(id, name, &[&args.to_string()])
}

/// The workspace: source files, a `.gitignore`d directory, a 3,000-line file, a file with a repeated
/// line, an image; a secret outside it and a symlink leading there.
fn fixture(dir: &Path) -> (PathBuf, PathBuf) {
    let ws = dir.join("ws");
    let outside = dir.join("outside");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::create_dir_all(ws.join("ignored")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "top secret").unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
    std::fs::write(ws.join(".gitignore"), "ignored/\n").unwrap();
    std::fs::write(ws.join("src/main.rs"), "fn main() {\n    println!(\"hello\");\n}\n").unwrap();
    std::fs::write(ws.join("src/lib.rs"), "pub fn greet() -> &'static str {\n    \"hello\"\n}\n").unwrap();
    std::fs::write(ws.join("ignored/main.rs"), "fn main() {}\n").unwrap();
    let big: String = (1..=3000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(ws.join("big.txt"), big).unwrap();
    std::fs::write(ws.join("dup.txt"), "x = 1\nx = 1\n").unwrap();
    std::fs::write(ws.join("pixel.png"), PNG).unwrap();
    (ws, outside)
}

/// The `toolResult` messages of the file, in chain order.
/// The names of the tools offered in the provider's first request.
fn offered(fake: &FakeProvider) -> Vec<String> {
    fake.bodies()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_with_pi_shapes_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (ws, outside) = fixture(dir.path());
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    // One message with many calls, run concurrently (none depends on another's effect).
    let t1 = turn(
        vec![
            text(&["Looking around."]),
            call("c1", "read", json!({"path": "big.txt"})),
            call("c2", "read", json!({"path": "src/main.rs", "offset": 2, "limit": 1})),
            call("c3", "ls", json!({"path": "src"})),
            call("c4", "find", json!({"pattern": "*.rs"})),
            call("c5", "grep", json!({"pattern": "fn main"})),
            call("c6", "edit", json!({"path": "dup.txt", "edits": [{"oldText": "x = 1", "newText": "x = 2"}]})),
            call("c7", "read", json!({"path": "../outside/secret.txt"})),
            call("c8", "write", json!({"path": "link/pwned.txt", "content": "pwned"})),
            call("c9", "read", json!({"path": outside.join("secret.txt").display().to_string()})),
            call("c10", "write", json!({"path": "notes/todo.md", "content": "- buy milk\n"})),
        ],
        (50, 30, 0),
    );
    let t2 = turn(
        vec![
            call(
                "d1",
                "edit",
                json!({"path": "src/lib.rs", "edits": [{"oldText": "\"hello\"", "newText": "\"bye\""},
                    {"oldText": "pub fn greet()", "newText": "pub fn greeting()"}]}),
            ),
            call("d2", "grep", json!({"pattern": "MILK", "ignoreCase": true, "context": 1})),
        ],
        (80, 20, 0),
    );
    let t3 = turn(vec![text(&["Done."])], (120, 4, 0));
    for t in [&t1, &t2, &t3] {
        fake.push(Reply::stream(script(f, t)));
    }
    let state = dir.path().join("state");
    let cfg = config(&fake, &ws, "[agents.defaults.tools]\napproval = \"allow\"\n");
    let gw = tokio::task::spawn_blocking({
        let state = state.clone();
        move || GatewayProcess::start(BIN, &state, &cfg)
    })
    .await
    .unwrap();
    let mut c = Client::connect(&gw.addr).await;
    let info = c.request("pincer.info", json!({})).await.unwrap();
    assert_eq!(info["tools"], json!(["bash", "edit", "find", "grep", "ls", "read", "write"]), "the coding profile");
    c.request("chat.send", json!({"sessionKey": "main", "message": "tidy up", "idempotencyKey": "r1"})).await.unwrap();
    let end = c.chat_end("r1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}\n{}", gw.log_text());

    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    let ids: Vec<&str> = results.iter().map(|m| m["toolCallId"].as_str().unwrap()).collect();
    assert_eq!(ids, ["c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9", "c10", "d1", "d2"], "source order");
    for m in &results {
        let keys: Vec<&str> = m.as_object().unwrap().keys().map(String::as_str).collect();
        let want: &[&str] = if m.get("details").is_some() {
            &["role", "toolCallId", "toolName", "content", "details", "isError", "timestamp"]
        } else {
            &["role", "toolCallId", "toolName", "content", "isError", "timestamp"]
        };
        assert_eq!(keys, want, "Pi's toolResult keys: {m}");
    }
    let by_id = |id: &str| results.iter().find(|m| m["toolCallId"] == id).unwrap();

    // read: the first 2,000 lines, Pi's notice and details.truncation.
    let r = by_id("c1");
    let body: String = (1..=2000).map(|i| format!("line {i}")).collect::<Vec<_>>().join("\n");
    assert_eq!(result_text(r), format!("{body}\n\n[Showing lines 1-2000 of 3001. Use offset=2001 to continue.]"));
    let t = &r["details"]["truncation"];
    assert_eq!(
        (&t["truncated"], &t["truncatedBy"], &t["totalLines"], &t["outputLines"], &t["maxLines"], &t["maxBytes"]),
        (&json!(true), &json!("lines"), &json!(3001), &json!(2000), &json!(2000), &json!(51200))
    );
    assert_eq!(
        result_text(by_id("c2")),
        "    println!(\"hello\");\n\n[2 more lines in file. Use offset=3 to continue.]"
    );
    assert_eq!(result_text(by_id("c3")), "lib.rs\nmain.rs");
    assert_eq!(result_text(by_id("c4")), "src/lib.rs\nsrc/main.rs", "ignored/ is .gitignore'd");
    assert_eq!(result_text(by_id("c5")), "src/main.rs:1: fn main() {");
    // edit with a repeated oldText: an error result, the file unchanged.
    assert_eq!(by_id("c6")["isError"], true);
    assert_eq!(
        result_text(by_id("c6")),
        "Found 2 occurrences of the text in dup.txt. The text must be unique. Please provide more context to make it unique."
    );
    assert_eq!(std::fs::read_to_string(ws.join("dup.txt")).unwrap(), "x = 1\nx = 1\n");
    // Escapes: refused, named, nothing read or written outside.
    assert_eq!(result_text(by_id("c7")), "../outside/secret.txt: refused, it resolves outside the workspace");
    assert_eq!(result_text(by_id("c8")), "link/pwned.txt: refused, it resolves outside the workspace");
    let abs = outside.join("secret.txt").display().to_string();
    assert_eq!(
        result_text(by_id("c9")),
        format!("{abs}: absolute paths are refused; give a path relative to the workspace")
    );
    for id in ["c7", "c8", "c9"] {
        assert_eq!(by_id(id)["isError"], true, "{id}");
    }
    assert!(!outside.join("pwned.txt").exists());
    // write: Pi's text, the file with its parent directory.
    assert_eq!(result_text(by_id("c10")), "Successfully wrote 11 bytes to notes/todo.md");
    assert_eq!(std::fs::read_to_string(ws.join("notes/todo.md")).unwrap(), "- buy milk\n");
    // edit with two disjoint edits: Pi's text, diff and first changed line.
    let d1 = by_id("d1");
    assert_eq!(result_text(d1), "Successfully replaced 2 block(s) in src/lib.rs.");
    assert_eq!(
        d1["details"],
        json!({"diff": "-1 pub fn greet() -> &'static str {\n-2     \"hello\"\n+1 pub fn greeting() -> &'static str {\n+2     \"bye\"\n 3 }", "firstChangedLine": 1})
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("src/lib.rs")).unwrap(),
        "pub fn greeting() -> &'static str {\n    \"bye\"\n}\n"
    );
    // grep with ignoreCase and context, over the file written in the message before.
    assert_eq!(result_text(by_id("d2")), "notes/todo.md:1: - buy milk\nnotes/todo.md-2- ");
    for id in ["c1", "c2", "c3", "c4", "c5", "c10", "d1", "d2"] {
        assert_eq!(by_id(id)["isError"], false, "{id}");
    }

    // What the provider received after each tool round is Pi's context of the file.
    assert_eq!(fake.bodies().len(), 3);
    check_request_against_pi(&file, &fake, 1);
    check_request_against_pi(&file, &fake, 2);
    assert_eq!(offered(&fake), ["bash", "edit", "find", "grep", "ls", "read", "write"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_returns_images_and_the_policy_shapes_the_tool_list() {
    let dir = tempfile::tempdir().unwrap();
    let (ws, _) = fixture(dir.path());
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    fake.push(Reply::stream(script(f, &turn(vec![call("i1", "read", json!({"path": "pixel.png"}))], (5, 5, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["A pixel."])], (5, 5, 0)))));
    let state = dir.path().join("state");
    let cfg = config(
        &fake,
        &ws,
        "[agents.defaults.tools]\nprofile = \"minimal\"\nallow = [\"current_time\"]\ndeny = [\"grep\"]\n",
    );
    let gw = tokio::task::spawn_blocking({
        let state = state.clone();
        move || GatewayProcess::start(BIN, &state, &cfg)
    })
    .await
    .unwrap();
    let mut c = Client::connect(&gw.addr).await;
    let info = c.request("pincer.info", json!({})).await.unwrap();
    assert_eq!(info["tools"], json!(["current_time", "find", "ls", "read"]));
    // OpenClaw's `tools.effective` inventory shape, for its Control UI and TUI.
    let effective = c.request("tools.effective", json!({"sessionKey": "main"})).await.unwrap();
    assert_eq!((&effective["agentId"], &effective["profile"]), (&json!("main"), &json!("minimal")));
    let group = &effective["groups"][0];
    assert_eq!(
        (&group["id"], &group["label"], &group["source"]),
        (&json!("core"), &json!("Built-in tools"), &json!("core"))
    );
    let labels: Vec<&str> = group["tools"].as_array().unwrap().iter().map(|t| t["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["Current Time", "Find", "Ls", "Read"]);
    assert_eq!(
        group["tools"][3],
        json!({"id": "read", "label": "Read", "source": "core",
            "description": "Read the contents of a file",
            "rawDescription": "Read the contents of a file. Supports text files and images (jpg, png, gif, webp). Images are sent as attachments. For text files, output is truncated to 2000 lines or 50KB (whichever is hit first). Use offset/limit for large files. When you need the full file, continue with offset until complete."})
    );
    let err = c.request("tools.effective", json!({"agentId": "ops"})).await.unwrap_err();
    assert_eq!(err["message"], "unknown agent id \"ops\"", "{err}");
    c.request("chat.send", json!({"sessionKey": "main", "message": "look", "idempotencyKey": "r1"})).await.unwrap();
    assert_eq!(c.chat_end("r1").await["payload"]["state"], "final");
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    use base64::Engine as _;
    assert_eq!(
        results[0]["content"],
        json!([{"type": "text", "text": "Read image file [image/png]"},
            {"type": "image", "data": base64::engine::general_purpose::STANDARD.encode(PNG), "mimeType": "image/png"}])
    );
    assert_eq!(offered(&fake), ["current_time", "find", "ls", "read"]);
}

#[test]
fn a_tool_the_config_names_but_pincer_lacks_stops_the_startup() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    for (tools, want) in [
        ("allow = [\"bash_it\"]", "unknown tool \"bash_it\""),
        ("deny = [\"rm\"]", "unknown tool \"rm\""),
        ("profile = \"everything\"", "unknown tool profile \"everything\""),
    ] {
        let stderr = refused_startup(BIN, &state, &format!("[agents.defaults.tools]\n{tools}\n"));
        assert!(stderr.contains(want) && stderr.contains("[agents.defaults.tools]"), "{tools}: {stderr}");
    }
}

/// `[agents.<id>]`: an agent with its own model, system prompt, workspace and tools over
/// `[agents.defaults]`. Its sessions (`agent:<id>:…`) run with them; its files land in its own
/// workspace (`<state>/workspace/<id>` by default), which another agent's tools cannot reach; the
/// clients see each agent's tools (`tools.effective`, `agents.list`, `pincer.info`); a bad agent
/// section stops the startup, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_configured_agent_has_its_own_model_prompt_workspace_and_tools() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let cfg = format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
         [agents.defaults]\nmodel = \"fake/general\"\nsystem_prompt = \"You are general.\"\n\
         [agents.defaults.tools]\nprofile = \"minimal\"\n\
         [agents.coder]\nmodel = \"fake/coder-model\"\nsystem_prompt = \"You are coder.\"\n\
         [agents.coder.tools]\nallow = [\"write\"]\napproval = \"allow\"\n",
        fake.base_url()
    );
    fake.push(Reply::stream(script(
        f,
        &turn(vec![call("w1", "write", json!({"path": "note.txt", "content": "from coder"}))], (5, 5, 0)),
    )));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["Saved."])], (5, 5, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![call("r1", "read", json!({"path": "note.txt"}))], (5, 5, 0)))));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["Not here."])], (5, 5, 0)))));
    let state = dir.path().join("state");
    let gw = tokio::task::spawn_blocking({
        let (state, cfg) = (state.clone(), cfg.clone());
        move || GatewayProcess::start(BIN, &state, &cfg)
    })
    .await
    .unwrap();
    let mut c = Client::connect(&gw.addr).await;
    let agents = c.request("agents.list", json!({})).await.unwrap();
    assert_eq!(
        agents["agents"],
        json!([{"id": "coder", "name": "coder", "model": {"primary": "fake/coder-model"}},
            {"id": "main", "name": "Main", "model": {"primary": "fake/general"}}])
    );
    let coder = c.request("tools.effective", json!({"agentId": "coder"})).await.unwrap();
    let ids: Vec<&str> =
        coder["groups"][0]["tools"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!((&coder["agentId"], ids), (&json!("coder"), vec!["find", "grep", "ls", "read", "write"]));
    let by_session = c.request("tools.effective", json!({"sessionKey": "agent:coder:main"})).await.unwrap();
    assert_eq!(by_session["agentId"], "coder");
    let info = c.request("pincer.info", json!({})).await.unwrap();
    assert_eq!(info["tools"], json!(["find", "grep", "ls", "read"]), "main: the defaults' minimal profile");
    let ws = |id: &str| state.join("workspace").join(id);
    assert_eq!(info["workspace"], ws("main").display().to_string());
    assert_eq!(info["agents"][0]["workspace"], ws("coder").display().to_string());

    c.request("chat.send", json!({"sessionKey": "agent:coder:main", "message": "save it", "idempotencyKey": "c1"}))
        .await
        .unwrap();
    assert_eq!(c.chat_end("c1").await["payload"]["state"], "final");
    assert_eq!(std::fs::read_to_string(ws("coder").join("note.txt")).unwrap(), "from coder");
    let first = &fake.bodies()[0];
    assert_eq!(first["model"], "coder-model");
    assert_eq!(first["messages"][0], json!({"role": "system", "content": "You are coder."}));
    assert_eq!(offered(&fake), ["find", "grep", "ls", "read", "write"]);

    c.request("chat.send", json!({"sessionKey": "main", "message": "read it", "idempotencyKey": "m1"})).await.unwrap();
    assert_eq!(c.chat_end("m1").await["payload"]["state"], "final");
    let main_call = &fake.bodies()[2];
    assert_eq!(main_call["model"], "general");
    assert_eq!(main_call["messages"][0], json!({"role": "system", "content": "You are general."}));
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let read = &tool_results(&file)[0];
    assert_eq!(read["isError"], true, "main's workspace has no note.txt: {read}");
    assert!(!ws("main").join("note.txt").exists());
    let coder_file = pincer_testkit::probe::transcript_path(&state, "agent:coder:main").unwrap();
    assert!(coder_file.starts_with(state.join("agents/coder/sessions")), "{}", coder_file.display());

    // An agent id that is not one, or a bad tool in an agent's table, stops the startup naming it.
    drop(c);
    drop(gw);
    for (section, want) in [
        ("[agents.Coder]\nmodel = \"fake/x\"\n", "[agents.Coder]: agentId \"Coder\" is not an agent id"),
        ("[agents.ops.tools]\nallow = [\"rm\"]\n", "[agents.ops.tools]: unknown tool \"rm\""),
        ("[agents.ops]\nmodle = \"fake/x\"\n", "unknown field `modle`"),
    ] {
        let stderr = refused_startup(BIN, &state, &format!("{cfg}{section}"));
        assert!(stderr.contains(want), "{section}: {stderr}");
    }
}
