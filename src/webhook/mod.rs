//! `peakfit webhook`: the mutating admission webhook that hands opted-in pods to peakfit's
//! scheduler and pins their containers to the GPUs bind assigns (see `mutate`). It may not call
//! the API server or the extender: it decides from the `AdmissionReview` alone.

pub mod mutate;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use mutate::{Mutator, OptIn, RequireVram};

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
    /// Refuse modelled pods without `peakfit.io/vram` when the model does not cover their
    /// workload kind (`uncovered`), or covers it with confidence `poor` (`poor`: uncovered and
    /// poor), or anything short of `good` (`fair`); `off` lets the model size every pod. The
    /// classes are the measured error bands `peakfit estimate` prints.
    #[arg(long, env = "PEAKFIT_REQUIRE_VRAM", value_enum, default_value_t = RequireVram::Off)]
    pub require_vram: RequireVram,
    /// Turn `nvidia.com/gpu: N` of an opted-in pod (its namespace's label, or a `peakfit.io/`
    /// annotation) into a peakfit pod of N whole GPUs: the resource is removed from its
    /// containers and `peakfit.io/gpus: N` (and, unless the pod sizes itself, `gpu-share: 1`)
    /// set, so that peakfit assigns its GPUs and the device plugin never hands out one that
    /// peakfit pods share (issue 23). `false` leaves such pods to the device plugin.
    #[arg(
        long,
        env = "PEAKFIT_CONVERT_DEVICE_PLUGIN_REQUESTS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub convert_device_plugin_requests: bool,
    /// Review bytes being read or answered at once, all reviews together (Kubernetes quantity,
    /// at least the 4 MiB a review may be): a review waits (up to --body-timeout, then 503) for
    /// room, so memory stays bounded however many large pods are created at once. A review
    /// without Content-Length counts as 4 MiB (the API server always sends one).
    #[arg(
        long,
        env = "PEAKFIT_MAX_BODY_BYTES_IN_FLIGHT",
        default_value = "16Mi",
        value_parser = crate::extender::parse_bytes
    )]
    pub max_body_bytes_in_flight: u64,
    #[command(flatten)]
    pub serve: crate::serve::ServeArgs,
}

/// The largest admission request read. The API server sends the pod as stored (etcd refuses
/// objects over 1.5 MiB); 4 MiB leaves room for the review around it.
pub const MAX_REVIEW_BYTES: usize = 4 << 20;

/// The default of `--max-body-bytes-in-flight`: four reviews of the largest size at once.
pub const DEFAULT_IN_FLIGHT_BYTES: u64 = 16 << 20;

/// The HTTP routes, without TLS, so tests can drive them with `tower::ServiceExt::oneshot`.
/// Every error reply is JSON `{"error": ...}`: 400 for a body that is not JSON, 415 for another
/// content type, 422 for JSON that is not an `AdmissionReview`, 413, 408, 404, 405, and 503 when
/// the in-flight budget stays full for the body timeout.
pub fn router(mutator: Mutator) -> Router {
    router_with(
        mutator,
        limits(DEFAULT_IN_FLIGHT_BYTES, &crate::serve::ServeArgs::default()),
    )
}

/// The webhook's body limits: [`MAX_REVIEW_BYTES`] per review, `in_flight` together.
pub fn limits(in_flight: u64, serve: &crate::serve::ServeArgs) -> crate::serve::BodyLimits {
    crate::serve::BodyLimits::new(MAX_REVIEW_BYTES as u64, in_flight, serve.body_timeout)
}

/// [`router`] under `limits` (`--max-body-bytes-in-flight`, `--body-timeout`).
pub fn router_with(mutator: Mutator, limits: crate::serve::BodyLimits) -> Router {
    let state = Arc::new(Shared { mutator, limits });
    Router::new()
        .route("/mutate", post(mutate_annotated))
        .route("/mutate/namespace", post(mutate_namespace))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(|uri: axum::http::Uri| async move {
            problem(
                StatusCode::NOT_FOUND,
                format!(
                    "no such endpoint {}: POST /mutate, /mutate/namespace; GET /healthz",
                    uri.path()
                ),
            )
        })
        .method_not_allowed_fallback(|m: axum::http::Method, uri: axum::http::Uri| async move {
            problem(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("{m} {} is not served", uri.path()),
            )
        })
        .with_state(state)
}

struct Shared {
    mutator: Mutator,
    limits: crate::serve::BodyLimits,
}

/// A JSON error reply, its message cut to [`crate::clip::MAX_MESSAGE_BYTES`] (a decoder's
/// message quotes the value it refused).
fn problem(status: StatusCode, error: impl std::fmt::Display) -> Response {
    let error = error.to_string();
    let body = serde_json::json!({
        "error": crate::clip::clip_to(&error, crate::clip::MAX_MESSAGE_BYTES),
    });
    (status, axum::Json(body)).into_response()
}

/// Answers one review: reads the body within the size, time and in-flight limits, then
/// decodes and decides on the blocking pool (a 4 MiB review is milliseconds of CPU), holding
/// the review's share of the budget until the answer is built.
async fn answer(s: Arc<Shared>, req: axum::extract::Request, opt_in: OptIn) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(len) = declared.filter(|&n| n > MAX_REVIEW_BYTES as u64) {
        return problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the review ({len} bytes) is larger than {MAX_REVIEW_BYTES} bytes"),
        );
    }
    let expect = declared.map_or(MAX_REVIEW_BYTES, crate::convert::u64_to_usize);
    let Ok(budget) = tokio::time::timeout(s.limits.timeout, s.limits.reserve(expect)).await else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "too many large reviews in flight (--max-body-bytes-in-flight {} bytes); retry",
                s.limits.in_flight_bytes
            ),
        );
    };
    let body = match read_review(&s, req, expect).await {
        Ok(body) => body,
        Err(r) => return r,
    };
    tokio::task::spawn_blocking(move || {
        let reply = match decode(&body) {
            Ok(review) => axum::Json(s.mutator.review(review, opt_in)).into_response(),
            Err(r) => *r,
        };
        drop(budget);
        reply
    })
    .await
    .unwrap_or_else(|e| {
        problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the review handler failed: {e}"),
        )
    })
}

/// Reads an `AdmissionReview`'s bytes within the size and time limits.
async fn read_review(
    s: &Shared,
    req: axum::extract::Request,
    expect: usize,
) -> Result<axum::body::Bytes, Response> {
    let json = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            let v = v.to_ascii_lowercase();
            v.starts_with("application/json") || v.contains("+json")
        });
    if !json {
        return Err(problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "expected Content-Type: application/json (an AdmissionReview)",
        ));
    }
    crate::serve::read_body(req.into_body(), expect, s.limits.timeout)
        .await
        .map_err(|e| problem(e.status(), e))
}

/// Decodes the fields of an `AdmissionReview` the webhook reads (`mutate::PodView`).
fn decode(body: &[u8]) -> Result<mutate::Review, Box<Response>> {
    serde_json::from_slice(body).map_err(|e| {
        let status = if e.is_data() {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::BAD_REQUEST
        };
        Box::new(problem(
            status,
            format!("the body is not an AdmissionReview: {e}"),
        ))
    })
}

async fn mutate_annotated(State(s): State<Arc<Shared>>, req: axum::extract::Request) -> Response {
    answer(s, req, OptIn::Annotation).await
}

async fn mutate_namespace(State(s): State<Arc<Shared>>, req: axum::extract::Request) -> Response {
    answer(s, req, OptIn::Namespace).await
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
        require_vram: args.require_vram,
        convert_device_plugin_requests: args.convert_device_plugin_requests,
    };
    let app = router_with(mutator, limits(args.max_body_bytes_in_flight, &args.serve));
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

    let stop = crate::shutdown::Stop::on_signal();
    let probes =
        crate::serve::spawn_probes(&args.serve, crate::serve::liveness_router(), stop.stopped())
            .await?;
    serve_with(listener, acceptor, app, &args.serve, stop.stopped()).await;
    if let Some(probes) = probes {
        probes.await?;
    }
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
    .await;
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
    crate::serve::serve(listener, handshake, app, args, shutdown).await;
}
