//! The throwaway homeserver behind the Matrix channel's tests ([`pincer_testkit::synapse`]) does what
//! those tests count on: users registered with the shared secret talk in a DM and a room, a message
//! read back carries its edits folded in, and a send repeated with the same transaction id is the
//! same event (what the gateway's resend after a crash relies on), while another token's is not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use pincer_testkit::synapse::Synapse;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_talk_edit_and_a_resent_transaction_is_one_event() {
    let syn = Synapse::shared();
    eprintln!("synapse answered after {:?}", syn.started_in);
    let (alice, bob) = (syn.register("alice").await, syn.register("bob").await);
    assert!(alice.user_id.starts_with("@alice-") && alice.user_id.ends_with(":localhost"), "{}", alice.user_id);

    // A DM: invite, join, talk.
    let dm = alice.create_room(&[&bob.user_id], true, false).await;
    assert_eq!(alice.membership(&dm, &bob.user_id).await.as_deref(), Some("invite"));
    bob.join(&dm).await;
    let mut members = alice.joined_members(&dm).await;
    members.sort();
    let mut want = vec![alice.user_id.clone(), bob.user_id.clone()];
    want.sort();
    assert_eq!(members, want);
    let hello = alice.send_text(&dm, "hello bob").await;

    // An edit is folded into the message it replaces; the edit itself is not listed.
    let first = bob.send_text_txn(&dm, "…", "txn-1").await;
    let edit = json!({"msgtype": "m.text", "body": "* hi alice", "m.new_content": {"msgtype": "m.text", "body": "hi alice",
        "format": "org.matrix.custom.html", "formatted_body": "<p>hi alice</p>"},
        "m.relates_to": {"rel_type": "m.replace", "event_id": first}});
    bob.call(
        reqwest::Method::PUT,
        &format!("/rooms/{}/send/m.room.message/edit-1", dm.replace('!', "%21")),
        Some(edit),
    )
    .await
    .unwrap();
    // The same transaction id again, from the same token: the same event, nothing new.
    assert_eq!(bob.send_text_txn(&dm, "…", "txn-1").await, first);
    // Another user's same transaction id is their own event.
    assert_ne!(alice.send_text_txn(&dm, "…", "txn-1").await, first);

    let msgs = alice.messages(&dm).await;
    assert_eq!(msgs.len(), 3, "{msgs:?}");
    assert_eq!((msgs[0].event_id.as_str(), msgs[0].body.as_str()), (hello.as_str(), "hello bob"));
    assert_eq!(
        (msgs[1].event_id.as_str(), msgs[1].final_body.as_str(), msgs[1].edits),
        (first.as_str(), "hi alice", 1)
    );
    assert_eq!(msgs[1].final_formatted.as_deref(), Some("<p>hi alice</p>"));

    // A room with encryption announced at its creation.
    let secret = alice.create_room(&[&bob.user_id], false, true).await;
    assert!(alice.has_state(&secret, "m.room.encryption").await);
    assert!(!alice.has_state(&dm, "m.room.encryption").await);
}
