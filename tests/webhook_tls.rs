//! The webhook's TLS path end to end: rustls (ring) serving the router on a real socket, a client
//! that trusts only the fixture certificate, and a certificate swapped on disk being picked up.

mod webhook_support;

use std::future::poll_fn;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use peakfit::webhook::tls::ReloadingCert;
use peakfit::webhook::{Mutator, router, serve};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/webhook-tls")
        .join(name)
}

fn client_trusting(cert: &Path) -> TlsConnector {
    TlsConnector::from(Arc::new(webhook_support::client_config_trusting(cert)))
}

/// GET /healthz over TLS; the handshake fails unless the server presents the trusted certificate.
async fn healthz(addr: std::net::SocketAddr, trusted: &Path) -> std::io::Result<String> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = client_trusting(trusted).connect(name, tcp).await?;
    let mut request: &[u8] =
        b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";
    // tokio's io-util extension traits are not enabled in this crate; poll the stream directly.
    while !request.is_empty() {
        let n = poll_fn(|cx| Pin::new(&mut tls).poll_write(cx, request)).await?;
        request = &request[n..];
    }
    poll_fn(|cx| Pin::new(&mut tls).poll_flush(cx)).await?;
    let mut out = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let mut buf = ReadBuf::new(&mut chunk);
        poll_fn(|cx| Pin::new(&mut tls).poll_read(cx, &mut buf)).await?;
        if buf.filled().is_empty() {
            break;
        }
        out.extend_from_slice(buf.filled());
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn serves_over_tls_and_picks_up_a_renewed_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(fixture("a.crt"), &crt).unwrap();
    std::fs::copy(fixture("a.key"), &key).unwrap();

    let cert = Arc::new(ReloadingCert::load(&crt, &key).expect("fixture pair loads"));
    let acceptor = TlsAcceptor::from(Arc::new(cert.server_config().unwrap()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(Mutator {
        scheduler_name: "peakfit-scheduler".into(),
        runtime_class_name: None,
        gpu_memory_resource: None,
    });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, acceptor, app, async {
        let _ = stopped.await;
    }));

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

    stop.send(()).unwrap();
    server.await.unwrap();
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
