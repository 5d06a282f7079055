//! HTTPS to a provider: a local TLS fake (the testkit fake provider behind a rustls server whose
//! self-signed certificate is made at test time) streams a reply to the real provider code in each
//! wire format, trusting the certificate through the provider's `ca_file`. Without TLS support in
//! the build (reqwest without rustls, or no crypto provider) these tests fail; without `ca_file`
//! the certificate is refused, so verification is on.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)] // tests write their fixture files directly
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pincer_agent::Providers;
use support::*;
use tokio::net::TcpListener;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::{self, ServerConfig};
use tokio_rustls::TlsAcceptor;

/// A TLS front for a plain fake provider: each connection's handshake is done here, then its bytes
/// are relayed to the fake. Returns the HTTPS address, the certificate (PEM) and the count of
/// completed handshakes.
async fn https_front(fake: &FakeProvider) -> (std::net::SocketAddr, String, Arc<AtomicUsize>) {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    let cert = CertificateDer::from(ck.cert.der().to_vec());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let config = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backend = fake.addr;
    let handshakes = Arc::new(AtomicUsize::new(0));
    let done = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (acceptor, done) = (acceptor.clone(), done.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(sock).await else { return };
                done.fetch_add(1, Ordering::SeqCst);
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (addr, ck.cert.pem(), handshakes)
}

/// The fake's base URL with `https://` and the TLS front's address.
fn https_base(fake: &FakeProvider, addr: std::net::SocketAddr) -> String {
    fake.base_url().replace(&format!("http://{}", fake.addr), &format!("https://{addr}"))
}

fn resolved(f: Format, base_url: &str, ca_file: Option<&std::path::Path>) -> pincer_agent::ResolvedModel {
    let mut cfg = provider_config(f, base_url, &Knobs { max_retries: 0, ..Knobs::default() });
    cfg.ca_file = ca_file.map(|p| p.to_owned());
    let providers = Providers::new(BTreeMap::from([(f.name().to_owned(), cfg)])).unwrap();
    providers.resolve(&format!("{}/{}", f.name(), f.model_id())).unwrap()
}

#[tokio::test]
async fn a_reply_streams_over_https_from_a_server_trusted_through_ca_file() {
    let dir = tempfile::tempdir().unwrap();
    for f in ALL {
        let fake = FakeProvider::start(f).await;
        let (addr, pem, handshakes) = https_front(&fake).await;
        let ca = dir.path().join(format!("{}-ca.pem", f.name()));
        std::fs::write(&ca, pem).unwrap();
        let t = turn(vec![text(&["Hello ", "over TLS."])], (10, 4, 0));
        fake.push(Reply::stream(script(f, &t)));
        let (events, messages) = simple_run(&fake, resolved(f, &https_base(&fake, addr), Some(&ca))).await;
        assert!(events.iter().any(|e| e.get("final").is_some()), "{f:?}: no final event: {events:?}");
        assert_eq!(messages.last().unwrap()["content"][0]["text"], "Hello over TLS.", "{f:?}");
        assert!(handshakes.load(Ordering::SeqCst) >= 1, "{f:?}: the request did not come through TLS");
        let reqs = fake.requests();
        assert_eq!(reqs.len(), 1, "{f:?}");
        assert_eq!(reqs[0].path, f.path());
        assert_eq!(reqs[0].headers.get("x-pincer-test").map(String::as_str), Some("1"));
    }
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let f = Format::OpenaiCompletions;
    let fake = FakeProvider::start(f).await;
    let (addr, _pem, handshakes) = https_front(&fake).await;
    let t = turn(vec![text(&["never"])], (1, 1, 0));
    fake.push(Reply::stream(script(f, &t)));
    let (events, _) = simple_run(&fake, resolved(f, &https_base(&fake, addr), None)).await;
    let err = events.iter().find_map(|e| e.get("error")).unwrap_or_else(|| panic!("no error: {events:?}"));
    let message = err["message"].as_str().unwrap().to_lowercase();
    assert!(message.contains("certificate"), "{message}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 0);
    assert!(fake.requests().is_empty(), "a request went through an untrusted connection");
}

#[test]
fn a_bad_ca_file_is_a_config_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    for path in [junk, dir.path().join("missing.pem")] {
        let mut cfg = provider_config(Format::OpenaiCompletions, "https://127.0.0.1:1/v1", &Knobs::default());
        cfg.ca_file = Some(path.clone());
        let err = Providers::new(BTreeMap::from([("p".to_owned(), cfg)])).unwrap_err().to_string();
        assert!(err.contains("ca_file") && err.contains(&path.display().to_string()), "{err}");
    }
}
