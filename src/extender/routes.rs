//! HTTP: the extender verbs, health, readiness and metrics.
//!
//! Replies are written with Go's JSON conventions (see `wire::to_go_json`). Only HTTP 200 is
//! success to kube-scheduler, so decisions and their failures travel inside 200 replies; a body
//! that is not the protocol's JSON gets a 400 naming the problem, an unknown path a 404, a wrong
//! method a 405, a body too large a 413 and one too slow a 408: every error reply is a JSON
//! `{"error": ..., "verb": ...}`.
//!
//! Decoding and the verbs' work are CPU-bound (rayon inside filter and prioritize): they run on
//! tokio's blocking pool, so a flood of large filters never starves `/healthz`, `/metrics` or a
//! bind waiting on the API server on the async workers.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Extender;
use super::wire::{self, ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs};
use crate::metrics::extender::VerbLabels;

type Shared = Arc<Extender>;

pub fn router(ext: Shared) -> Router {
    let verbs = Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .route("/preempt", post(preempt));
    Router::new()
        .merge(verbs.clone())
        // kube-scheduler posts to `<urlPrefix>/<verb>`; a prefix with a path is common.
        .nest("/{prefix}", verbs)
        .merge(ops())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(ext)
}

/// Only `GET /metrics /healthz /readyz`: what `--metrics-listen` serves beyond loopback.
pub fn ops_router(ext: Shared) -> Router {
    ops()
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(ext)
}

/// Only `GET /healthz /readyz`: what `--probe-listen` serves, to the kubelet alone.
pub fn probe_router(ext: Shared) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(ext)
}

fn ops() -> Router<Shared> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// A JSON error body: `{"error": "...", "verb": "..."}`, the error cut to
/// [`crate::clip::MAX_MESSAGE_BYTES`] (a decoder's message quotes the value it refused).
fn problem(status: StatusCode, verb: &str, error: impl std::fmt::Display) -> Response {
    let error = error.to_string();
    let body = serde_json::json!({
        "error": crate::clip::clip_to(&error, crate::clip::MAX_MESSAGE_BYTES),
        "verb": crate::clip::clip(verb),
    });
    (status, axum::Json(body)).into_response()
}

async fn not_found(uri: axum::http::Uri) -> Response {
    problem(
        StatusCode::NOT_FOUND,
        "",
        format!(
            "no such endpoint {}: POST /filter, /prioritize, /bind, /preempt; GET /healthz, /readyz, /metrics",
            uri.path()
        ),
    )
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let allowed = if uri.path().ends_with('z') || uri.path() == "/metrics" {
        "GET"
    } else {
        "POST"
    };
    let verb = uri.path().rsplit('/').next().unwrap_or_default().to_owned();
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        &verb,
        format!("{method} {} is not served: use {allowed}", uri.path()),
    )
}

fn go_json(value: &impl Serialize) -> Response {
    match wire::to_go_json(value) {
        Ok(bytes) => ([(CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => problem(StatusCode::INTERNAL_SERVER_ERROR, "", e),
    }
}

fn parse<T: DeserializeOwned>(verb: &'static str, body: &[u8]) -> Result<T, Box<Response>> {
    // serde would read a JSON array as a struct's fields in order; Go refuses it, and so do we.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(Box::new(problem(
            StatusCode::BAD_REQUEST,
            verb,
            format!("the body is not a valid {verb} request: expected a JSON object, got an array"),
        )));
    }
    serde_json::from_slice(body).map_err(|e| {
        Box::new(problem(
            StatusCode::BAD_REQUEST,
            verb,
            format!("the body is not a valid {verb} request: {e}"),
        ))
    })
}

/// Times the call and counts failures, whatever path it takes out.
struct Timed<'a> {
    ext: &'a Extender,
    verb: &'static str,
    start: Instant,
}

impl<'a> Timed<'a> {
    fn new(ext: &'a Extender, verb: &'static str) -> Self {
        Self {
            ext,
            verb,
            start: Instant::now(),
        }
    }

    fn error(&self) {
        self.ext
            .metrics
            .errors
            .get_or_create(&VerbLabels { verb: self.verb })
            .inc();
    }

    /// Decodes the request body, counting a malformed one as this verb's error.
    fn parse<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T, Box<Response>> {
        parse(self.verb, body).inspect_err(|_| self.error())
    }

    /// Why the extender cannot decide yet (counted as an error), or `None` when it can.
    fn not_ready(&self) -> Option<String> {
        let reason = not_ready(self.ext);
        if reason.is_some() {
            self.error();
        }
        reason
    }
}

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        self.ext
            .metrics
            .request_duration
            .get_or_create(&VerbLabels { verb: self.verb })
            .observe(self.start.elapsed().as_secs_f64());
    }
}

/// Until every watch has synced the index may call a busy node free: refuse to decide.
fn not_ready(ext: &Extender) -> Option<String> {
    (!ext.readiness.is_ready())
        .then(|| "peakfit's cache of the cluster has not synced yet; retry shortly".to_owned())
}

/// A request body, read within the extender's limits, and its share of the bytes-in-flight
/// budget (held until the reply is written, since the decoded request is about as large).
struct Received {
    body: Bytes,
    budget: tokio::sync::OwnedSemaphorePermit,
}

/// The reply, holding the request's share of the budget grown to the reply's size until its
/// body is written or dropped: a reply counts like a request, and a client that reads slowly
/// holds what its replies cost (before, the share went back when the handler returned). A reply
/// that finds no room within the body timeout is dropped for a 503.
fn budgeted(
    ext: &Extender,
    verb: &'static str,
    reply: Response,
    held: tokio::sync::OwnedSemaphorePermit,
) -> Response {
    use http_body::Body as _;
    let bytes = reply
        .body()
        .size_hint()
        .exact()
        .map_or(0, crate::convert::u64_to_usize);
    let Some(held) = ext.body.grow_blocking(held, bytes) else {
        drop(reply);
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            verb,
            format!(
                "too many large replies in flight (--max-body-bytes-in-flight {} bytes); retry",
                ext.body.in_flight_bytes
            ),
        );
    };
    let (parts, body) = reply.into_parts();
    Response::from_parts(
        parts,
        axum::body::Body::new(Held {
            body,
            _budget: held,
        }),
    )
}

/// A body that returns its budget when dropped (written or abandoned); its size hint is its
/// body's, so the reply keeps its `Content-Length`.
struct Held {
    body: axum::body::Body,
    _budget: tokio::sync::OwnedSemaphorePermit,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Reads the body: refuses one declared larger than the limit before reading it, waits (up to
/// the body timeout) for room in the bytes-in-flight budget, then reads within the timeout.
async fn receive(ext: &Extender, verb: &'static str, req: Request) -> Result<Received, Response> {
    let limits = &ext.body;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let too_large = |len: String| {
        problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            verb,
            format!(
                "the request body ({len}) is larger than --max-body-bytes ({} bytes)",
                limits.max_bytes
            ),
        )
    };
    if let Some(len) = declared.filter(|&n| n > limits.max_bytes as u64) {
        return Err(too_large(format!("{len} bytes")));
    }
    let expect = declared.map_or(limits.max_bytes, crate::convert::u64_to_usize);
    let budget = tokio::time::timeout(limits.timeout, limits.reserve(expect))
        .await
        .map_err(|_| {
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                verb,
                format!(
                    "too many large requests in flight (--max-body-bytes-in-flight {} bytes); retry",
                    limits.in_flight_bytes
                ),
            )
        })?;
    match crate::serve::read_body(req.into_body(), expect, limits.timeout).await {
        Ok(body) => Ok(Received { body, budget }),
        Err(crate::serve::BodyError::TooLarge(_)) => Err(too_large("more".to_owned())),
        Err(e) => Err(problem(e.status(), verb, e)),
    }
}

/// Runs the CPU-bound part of a verb on the blocking pool.
async fn off_the_workers(
    verb: &'static str,
    f: impl FnOnce() -> Response + Send + 'static,
) -> Response {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            verb,
            format!("the {verb} handler failed: {e}"),
        )
    })
}

/// A verb that only reads: receive the body, then decode and answer on the blocking pool.
async fn blocking_verb(
    ext: Shared,
    verb: &'static str,
    req: Request,
    answer: fn(&Extender, &Timed<'_>, &[u8]) -> Response,
) -> Response {
    let received = match receive(&ext, verb, req).await {
        Ok(r) => r,
        Err(r) => {
            Timed::new(&ext, verb).error();
            return r;
        }
    };
    off_the_workers(verb, move || {
        let t = Timed::new(&ext, verb);
        let reply = answer(&ext, &t, &received.body);
        let Received { body, budget } = received;
        drop(body);
        budgeted(&ext, verb, reply, budget)
    })
    .await
}

/// kube-scheduler always sends the pod; a request without one is a client's mistake, answered
/// as filter answers it (prioritize and preempt replies have no error field, so with a 400).
fn no_pod(t: &Timed<'_>) -> Response {
    t.error();
    problem(
        StatusCode::BAD_REQUEST,
        t.verb,
        "the request has no Pod (field `Pod` is null or missing)",
    )
}

async fn filter(State(ext): State<Shared>, req: Request) -> Response {
    blocking_verb(ext, "filter", req, |ext, t, body| {
        let args: ExtenderArgs = match t.parse(body) {
            Ok(a) => a,
            Err(r) => return *r,
        };
        if let Some(e) = t.not_ready() {
            return go_json(&wire::ExtenderFilterResult {
                error: e,
                ..Default::default()
            });
        }
        let result = ext.filter(args);
        if !result.error.is_empty() {
            t.error();
        }
        go_json(&result)
    })
    .await
}

async fn prioritize(State(ext): State<Shared>, req: Request) -> Response {
    blocking_verb(ext, "prioritize", req, |ext, t, body| {
        let args: ExtenderArgs = match t.parse(body) {
            Ok(a) => a,
            Err(r) => return *r,
        };
        if args.pod.is_none() {
            return no_pod(t);
        }
        if let Some(e) = t.not_ready() {
            return problem(StatusCode::SERVICE_UNAVAILABLE, "prioritize", e);
        }
        go_json(&ext.prioritize(args))
    })
    .await
}

async fn bind(State(ext): State<Shared>, req: Request) -> Response {
    let t = Timed::new(&ext, "bind");
    let received = match receive(&ext, "bind", req).await {
        Ok(r) => r,
        Err(r) => {
            t.error();
            return r;
        }
    };
    // A binding request is a few hundred bytes: decoding it here costs less than a hop.
    let args: ExtenderBindingArgs = match t.parse(&received.body) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    drop(received);
    if let Some(error) = t.not_ready() {
        return go_json(&wire::ExtenderBindingResult { error });
    }
    // A conflict (the ledger moved since filter) is refused but is no error.
    let (result, outcome) = ext.bind_with_outcome(args).await;
    if outcome.is_err_and(|r| r.is_error()) {
        t.error();
    }
    go_json(&result)
}

async fn preempt(State(ext): State<Shared>, req: Request) -> Response {
    blocking_verb(ext, "preempt", req, |ext, t, body| {
        let args: ExtenderPreemptionArgs = match t.parse(body) {
            Ok(a) => a,
            Err(r) => return *r,
        };
        if args.pod.is_none() {
            return no_pod(t);
        }
        if let Some(e) = t.not_ready() {
            return problem(StatusCode::SERVICE_UNAVAILABLE, "preempt", e);
        }
        go_json(&ext.preempt(args))
    })
    .await
}

async fn readyz(State(ext): State<Shared>) -> Response {
    match not_ready(&ext) {
        None => "ok".into_response(),
        Some(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "readyz", e),
    }
}

/// Rendered at most once per `Extender::scrape`'s age (a second in the binary).
async fn metrics(
    State(ext): State<Shared>,
    peer: Option<axum::Extension<crate::serve::Peer>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let render = ext.clone();
    let peer = peer.map(|p| p.0.0.ip());
    ext.scrape
        .serve(crate::metrics::accepts_gzip(&headers), peer, move || {
            render.refresh_pending_gauges();
            crate::metrics::encode(&render.metrics.registry)
        })
        .await
}
