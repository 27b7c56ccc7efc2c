//! `peakfit webhook`: the mutating admission webhook that hands opted-in pods to peakfit's
//! scheduler and pins their containers to the GPUs bind assigns (see `mutate`). It may not call
//! the API server or the extender: it decides from the AdmissionReview alone.

pub mod mutate;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use mutate::{Mutator, OptIn};

#[derive(Clone, Debug, clap::Args)]
pub struct WebhookArgs {
    /// Address to serve HTTPS on.
    #[arg(long, env = "PEAKFIT_WEBHOOK_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// PEM certificate chain (re-read when it changes on disk).
    #[arg(long, env = "PEAKFIT_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// PEM private key matching `--tls-cert`.
    #[arg(long, env = "PEAKFIT_TLS_KEY")]
    pub tls_key: PathBuf,
    /// Scheduler name set on opted-in pods.
    #[arg(
        long,
        env = "PEAKFIT_SCHEDULER_NAME",
        default_value = "peakfit-scheduler"
    )]
    pub scheduler_name: String,
    /// Runtime class set on opted-in pods that name none (e.g. `nvidia`); empty leaves pods alone.
    #[arg(long, env = "PEAKFIT_RUNTIME_CLASS_NAME", default_value = "")]
    pub runtime_class_name: String,
    /// Extended resource in which an opted-in pod's least GPU memory (MiB) is requested, so
    /// kube-scheduler's own fit and preemption see it; the agents' `--gpu-memory-resource` must
    /// name the same one (they advertise each node's total). Empty: not requested.
    #[arg(
        long,
        env = "PEAKFIT_GPU_MEMORY_RESOURCE",
        default_value = crate::agent::publish::DEFAULT_GPU_MEMORY_RESOURCE
    )]
    pub gpu_memory_resource: String,
}

/// The HTTP routes, without TLS, so tests can drive them with `tower::ServiceExt::oneshot`.
pub fn router(mutator: Mutator) -> Router {
    Router::new()
        .route("/mutate", post(mutate_annotated))
        .route("/mutate/namespace", post(mutate_namespace))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(Arc::new(mutator))
}

async fn mutate_annotated(
    State(m): State<Arc<Mutator>>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<serde_json::Value> {
    axum::Json(m.review(review, OptIn::Annotation))
}

async fn mutate_namespace(
    State(m): State<Arc<Mutator>>,
    axum::Json(review): axum::Json<AdmissionReview<DynamicObject>>,
) -> axum::Json<serde_json::Value> {
    axum::Json(m.review(review, OptIn::Namespace))
}

pub async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    let cert = Arc::new(
        tls::ReloadingCert::load(&args.tls_cert, &args.tls_key)
            .context("loading the webhook's serving certificate")?,
    );
    let acceptor = TlsAcceptor::from(Arc::new(cert.server_config()?));
    let mutator = Mutator {
        scheduler_name: args.scheduler_name,
        runtime_class_name: Some(args.runtime_class_name).filter(|c| !c.is_empty()),
        gpu_memory_resource: Some(args.gpu_memory_resource.trim().to_owned())
            .filter(|r| !r.is_empty()),
    };
    let app = router(mutator);
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(listen = %args.listen, "webhook serving");

    let reload = cert.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        loop {
            tick.tick().await;
            reload.refresh();
        }
    });

    serve(listener, acceptor, app, crate::shutdown::signal()).await;
    tracing::info!("webhook stopping");
    Ok(())
}

/// How long a connection may take to send a request's headers, idle keep-alive included: the API
/// server sends each review at once and reconnects when a kept-alive connection was closed.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts TLS connections and serves `app` on each until `shutdown` completes. A failed handshake
/// or a broken connection only ends that connection.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                .await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            // Without a timer hyper silently drops its header-read timeout, and a client that
            // completes the handshake and then sends nothing would hold its connection (and file
            // descriptor) forever; enough of those take the webhook down for every opted-in pod.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tls), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
