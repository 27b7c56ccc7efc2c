//! `peakfit webhook`: the mutating admission webhook that hands opted-in pods to peakfit's
//! scheduler and pins their containers to the GPUs bind assigns (see `mutate`).

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
    #[command(flatten)]
    pub serve: crate::serve::ServeArgs,
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

    serve_with(
        listener,
        acceptor,
        app,
        &args.serve,
        crate::shutdown::signal(),
    )
    .await;
    tracing::info!("webhook stopping");
    Ok(())
}

/// How long a TLS handshake may take: a client that connects and stays silent costs a slot
/// for at most this long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// [`serve_with`] under the default limits.
pub async fn serve(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    shutdown: impl std::future::Future<Output = ()>,
) {
    serve_with(
        listener,
        acceptor,
        app,
        &crate::serve::ServeArgs::default(),
        shutdown,
    )
    .await
}

/// Accepts TLS connections and serves `app` on each until `shutdown` completes, under the
/// header, idle, connection and shutdown limits of `crate::serve` (the body timeout and size
/// are `router`'s). A failed handshake or a broken connection only ends that connection.
pub async fn serve_with(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    app: Router,
    args: &crate::serve::ServeArgs,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let handshake = move |stream: tokio::net::TcpStream| {
        let acceptor = acceptor.clone();
        async move {
            let peer = stream.peer_addr().ok();
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => Some(tls),
                Ok(Err(e)) => {
                    tracing::debug!(?peer, error = %e, "TLS handshake failed");
                    None
                }
                Err(_) => {
                    tracing::debug!(?peer, "TLS handshake timed out");
                    None
                }
            }
        }
    };
    crate::serve::serve(listener, handshake, app, args, shutdown).await
}
