//! The webhook's TLS path end to end: rustls (ring) serving the router on a real socket, a client
//! that trusts only the fixture certificate, and a certificate swapped on disk being picked up.

use std::path::{Path, PathBuf};

use peakfit::webhook::tls::ReloadingCert;

mod tls_support;
use tls_support::{Webhook, connect, exchange};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/webhook-tls")
        .join(name)
}

/// GET /healthz over TLS; the handshake fails unless the server presents the trusted certificate.
async fn healthz(addr: std::net::SocketAddr, trusted: &Path) -> std::io::Result<String> {
    let mut tls = connect(addr, trusted, "localhost").await?;
    exchange(
        &mut tls,
        b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
    )
    .await
}

#[tokio::test]
async fn serves_over_tls_and_picks_up_a_renewed_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(fixture("a.crt"), &crt).unwrap();
    std::fs::copy(fixture("a.key"), &key).unwrap();

    let webhook = Webhook::start(&crt, &key).await;
    let (addr, cert) = (webhook.addr, webhook.cert.clone());

    let reply = healthz(addr, &fixture("a.crt"))
        .await
        .expect("TLS with pair a");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("ok"), "{reply}");
    assert!(
        healthz(addr, &fixture("b.crt")).await.is_err(),
        "a client trusting only b must refuse a"
    );

    // cert-manager renews: both files change; the next refresh serves the new pair.
    std::fs::copy(fixture("b.crt"), &crt).unwrap();
    std::fs::copy(fixture("b.key"), &key).unwrap();
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&crt)
        .unwrap()
        .set_modified(later)
        .unwrap();
    cert.refresh();
    let reply = healthz(addr, &fixture("b.crt"))
        .await
        .expect("TLS with pair b");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    // A half-written update (key of a, certificate of b) keeps b serving.
    std::fs::copy(fixture("a.key"), &key).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&key)
        .unwrap()
        .set_modified(later + std::time::Duration::from_secs(5))
        .unwrap();
    cert.refresh();
    healthz(addr, &fixture("b.crt"))
        .await
        .expect("still pair b after a mismatched update");

    webhook.stop().await;
}

#[test]
fn a_mismatched_pair_is_refused_at_start_naming_both_files() {
    let err = ReloadingCert::load(&fixture("a.crt"), &fixture("b.key")).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("a.crt") && message.contains("b.key"),
        "{message}"
    );
    let err = ReloadingCert::load(&fixture("missing.crt"), &fixture("a.key")).unwrap_err();
    assert!(err.to_string().contains("missing.crt"), "{err}");
}
