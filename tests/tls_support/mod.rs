//! The webhook served over TLS on loopback, and a client that trusts only a given CA: what
//! `tests/webhook_tls.rs` and the chart's TLS check in `tests/chart.rs` share. In-process (the
//! library's `router` and `serve`), no cluster and no `peakfit` binary.
#![allow(dead_code)] // each test crate uses a different part

use std::future::poll_fn;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use peakfit::webhook::tls::ReloadingCert;
use peakfit::webhook::{Mutator, router, serve};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The webhook's router (the chart's scheduler name) serving TLS with the pair `crt`/`key` on a
/// loopback port until [`Webhook::stop`].
pub struct Webhook {
    pub addr: SocketAddr,
    /// The certificate being served; `refresh()` picks up a renewed pair.
    pub cert: Arc<ReloadingCert>,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<()>,
}

impl Webhook {
    /// Panics, naming the files, when the pair does not load.
    pub async fn start(crt: &Path, key: &Path) -> Self {
        let cert = Arc::new(
            ReloadingCert::load(crt, key)
                .unwrap_or_else(|e| panic!("{} and {}: {e}", crt.display(), key.display())),
        );
        let acceptor = TlsAcceptor::from(Arc::new(cert.server_config().unwrap()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = router(Mutator {
            scheduler_name: "peakfit-scheduler".into(),
            runtime_class_name: None,
            gpu_memory_resource: None,
            require_vram: peakfit::webhook::RequireVram::Off,
            convert_device_plugin_requests: false,
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, acceptor, app, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            cert,
            stop,
            server,
        }
    }

    /// Stops the server and waits for it; panics if it had already stopped.
    pub async fn stop(self) {
        self.stop.send(()).expect("the webhook is still serving");
        self.server.await.unwrap();
    }
}

/// A TLS client that trusts only the certificates in the PEM file `ca`.
pub fn client_trusting(ca: &Path) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// A TLS connection to `addr` as `server_name`, trusting only `ca`; fails unless the server
/// presents a certificate for that name signed by `ca`.
pub async fn connect(
    addr: SocketAddr,
    ca: &Path,
    server_name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    client_trusting(ca).connect(name, tcp).await
}

/// Writes `request` and reads until the server closes (tokio's io-util traits are not enabled in
/// this crate, so the stream is polled directly).
pub async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    mut request: &[u8],
) -> std::io::Result<String> {
    while !request.is_empty() {
        let n = poll_fn(|cx| Pin::new(&mut *s).poll_write(cx, request)).await?;
        request = &request[n..];
    }
    poll_fn(|cx| Pin::new(&mut *s).poll_flush(cx)).await?;
    let mut out = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let mut buf = ReadBuf::new(&mut chunk);
        poll_fn(|cx| Pin::new(&mut *s).poll_read(cx, &mut buf)).await?;
        if buf.filled().is_empty() {
            break;
        }
        out.extend_from_slice(buf.filled());
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}
