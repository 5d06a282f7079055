//! `web_fetch` through the real gateway (checked against the real Pi library, so it needs the Pi
//! oracle on Node and builds only with the `external` feature): with `profile = "full"` and the
//! private network allowed, a scripted OpenAI-compatible fake asks for a local page; the
//! `toolResult` row on disk carries the page's readable text and OpenClaw's details, `pincer.info`
//! and `tools.effective` list the tool, and the provider's next request is exactly Pi's context of
//! the file. With the default settings the same fetch is an error result naming the refused
//! address, and the page server is never asked.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly

use pincer_testkit::fake_provider::{script, text, tool_call, turn, FakeProvider, Format, Reply};
use pincer_testkit::gateway::{Client, GatewayProcess};
use pincer_testkit::web::{Answer, Server};
use pincer_testkit::wire::{check_request_against_pi, result_text, tool_results};
use pretty_assertions::assert_eq;
use serde_json::json;
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_pincer");

const PAGE: &str = "<html><head><title>Release notes</title><script>track()</script></head><body>\
    <nav><a href=\"/\">Home</a></nav><h1>Version 2</h1><p>See the <a href=\"/changes\">full list</a>.</p>\
    <ul><li>faster</li><li>smaller</li></ul></body></html>";

fn config(fake: &FakeProvider, workspace: &Path, tools: &str) -> String {
    format!(
        "[models.providers.fake]\napi = \"openai-completions\"\nbase_url = \"{}\"\napi_key = \"test-key\"\n\
         [[models.providers.fake.models]]\nid = \"gpt-test\"\ncontext_window = 1000000\n\
         [agents.defaults]\nmodel = \"fake/gpt-test\"\nworkspace = \"{}\"\n[agents.defaults.tools]\n{tools}",
        fake.base_url(),
        workspace.display()
    )
}

/// Starts a gateway with `tools`, has the fake model fetch `url` then answer, and returns the
/// `toolResult` row, the transcript and the fake (for the Pi check).
async fn fetch_through_gateway(
    dir: &Path,
    url: &str,
    tools: &str,
) -> (serde_json::Value, std::path::PathBuf, FakeProvider) {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let fake = FakeProvider::start(Format::OpenaiCompletions).await;
    let f = Format::OpenaiCompletions;
    let args = json!({"url": url, "maxChars": 1000}).to_string();
    fake.push(Reply::stream(script(
        f,
        &turn(vec![text(&["Reading it."]), tool_call("w1", "web_fetch", &[&args])], (20, 10, 0)),
    )));
    fake.push(Reply::stream(script(f, &turn(vec![text(&["Version 2 is faster."])], (60, 6, 0)))));
    let state = dir.join("state");
    let cfg = config(&fake, &ws, tools);
    let gw = tokio::task::spawn_blocking({
        let state = state.clone();
        move || GatewayProcess::start(BIN, &state, &cfg)
    })
    .await
    .unwrap();
    let mut c = Client::connect(&gw.addr).await;
    let info = c.request("pincer.info", json!({})).await.unwrap();
    let listed: Vec<&str> = info["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(listed.contains(&"web_fetch"), "pincer.info lists web_fetch: {info}");
    let effective = c.request("tools.effective", json!({"sessionKey": "main"})).await.unwrap();
    let card = effective["groups"][0]["tools"].as_array().unwrap().iter().find(|t| t["id"] == "web_fetch").cloned();
    assert_eq!(card.unwrap()["label"], "Web Fetch");
    c.request("chat.send", json!({"sessionKey": "main", "message": "what is new?", "idempotencyKey": "r1"}))
        .await
        .unwrap();
    let end = c.chat_end("r1").await;
    assert_eq!(end["payload"]["state"], "final", "{end}\n{}", gw.log_text());
    let file = pincer_testkit::probe::transcript_path(&state, "agent:main:main").unwrap();
    let results = tool_results(&file);
    assert_eq!(results.len(), 1);
    (results[0].clone(), file, fake)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_fetch_reads_a_page_through_the_gateway_as_pi_would_send_it() {
    let dir = tempfile::tempdir().unwrap();
    let site = Server::start("127.0.0.1", |path| match path {
        "/notes" => Answer::Page("200 OK", "text/html", PAGE.to_owned()),
        _ => Answer::Page("404 Not Found", "text/plain", "no".to_owned()),
    })
    .await;
    let url = site.url("/notes");
    let (r, file, fake) =
        fetch_through_gateway(dir.path(), &url, "profile = \"full\"\nweb_fetch_private_network = true\n").await;
    assert_eq!(r["isError"], false, "{r}");
    assert_eq!(
        result_text(&r),
        format!("# Version 2\n\nSee the [full list]({}).\n\n- faster\n- smaller", site.url("/changes"))
    );
    let d = &r["details"];
    assert_eq!(
        (&d["url"], &d["finalUrl"], &d["status"], &d["contentType"], &d["title"], &d["truncated"]),
        (&json!(url), &json!(url), &json!(200), &json!("text/html"), &json!("Release notes"), &json!(false))
    );
    assert_eq!(site.seen(), ["/notes"]);
    // The provider's second request is the real Pi library's context of the file.
    assert_eq!(fake.bodies().len(), 2);
    check_request_against_pi(&file, &fake, 1);
    let bodies = fake.bodies();
    let offered: Vec<&str> =
        bodies[0]["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(offered, ["bash", "current_time", "edit", "find", "grep", "ls", "read", "web_fetch", "write"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_loopback_fetch_is_an_error_result_and_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    let site = Server::start("127.0.0.1", |_| Answer::Page("200 OK", "text/plain", "internal".to_owned())).await;
    let url = site.url("/admin");
    let (r, file, fake) = fetch_through_gateway(dir.path(), &url, "allow = [\"web_fetch\"]\n").await;
    assert_eq!(r["isError"], true, "{r}");
    assert_eq!(
        result_text(&r),
        format!(
            "web_fetch {url}: refused, 127.0.0.1 is a loopback address; loopback, private and link-local addresses \
             are fetched only with [agents.defaults.tools] web_fetch_private_network = true"
        )
    );
    assert_eq!(site.seen(), Vec::<String>::new());
    check_request_against_pi(&file, &fake, 1);
}
