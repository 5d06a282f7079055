//! Tools through the real gateway: `read` returns images and the tool policy shapes the tool list;
//! a tool the config names but Pincer lacks stops the startup; each configured agent has its own
//! model, prompt, workspace and tools. The tests that also need the Pi oracle (Node) are in
//! `tools_external.rs`.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_provider::{script, text, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::{refused_startup, Client, GatewayProcess};
use pincer_testkit::wire::tool_results;
use pretty_assertions::assert_eq;
use serde_json::json;

#[path = "tools/common.rs"]
mod common;
use common::*;

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
