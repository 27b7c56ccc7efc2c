//! HTTP: the extender verbs, health, readiness and metrics.
//!
//! Replies are written with Go's JSON conventions (see `wire::to_go_json`). Only HTTP 200 is
//! success to kube-scheduler, so decisions and their failures travel inside 200 replies; a body
//! that is not the protocol's JSON gets a 400 naming the problem, an unknown path a 404.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Extender;
use super::wire::{self, ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs};
use crate::metrics::extender::VerbLabels;

/// Full-node requests carry every candidate Node; 5,000 nodes with images and conditions come
/// to tens of megabytes, far past axum's 2 MB default.
pub const BODY_LIMIT_BYTES: usize = 256 << 20;

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
        .layer(DefaultBodyLimit::max(BODY_LIMIT_BYTES))
        .with_state(ext)
}

/// Only `GET /metrics /healthz /readyz`: what `--metrics-listen` serves beyond loopback.
pub fn ops_router(ext: Shared) -> Router {
    ops().fallback(not_found).with_state(ext)
}

fn ops() -> Router<Shared> {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

/// A JSON error body: `{"error": "...", "verb": "..."}`.
fn problem(status: StatusCode, verb: &str, error: impl std::fmt::Display) -> Response {
    let body = serde_json::json!({ "error": error.to_string(), "verb": verb });
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

async fn filter(State(ext): State<Shared>, body: Bytes) -> Response {
    let t = Timed::new(&ext, "filter");
    let args: ExtenderArgs = match t.parse(&body) {
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
}

async fn prioritize(State(ext): State<Shared>, body: Bytes) -> Response {
    let t = Timed::new(&ext, "prioritize");
    let args: ExtenderArgs = match t.parse(&body) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    if let Some(e) = t.not_ready() {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "prioritize", e);
    }
    go_json(&ext.prioritize(args))
}

async fn bind(State(ext): State<Shared>, body: Bytes) -> Response {
    let t = Timed::new(&ext, "bind");
    let args: ExtenderBindingArgs = match t.parse(&body) {
        Ok(a) => a,
        Err(r) => return *r,
    };
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

async fn preempt(State(ext): State<Shared>, body: Bytes) -> Response {
    let t = Timed::new(&ext, "preempt");
    let args: ExtenderPreemptionArgs = match t.parse(&body) {
        Ok(a) => a,
        Err(r) => return *r,
    };
    if let Some(e) = t.not_ready() {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "preempt", e);
    }
    go_json(&ext.preempt(args))
}

async fn readyz(State(ext): State<Shared>) -> Response {
    match not_ready(&ext) {
        None => "ok".into_response(),
        Some(e) => (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
    }
}

async fn metrics(State(ext): State<Shared>) -> Response {
    ext.refresh_pending_gauges();
    crate::metrics::render(&ext.metrics.registry)
}
