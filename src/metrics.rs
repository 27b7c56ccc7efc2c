//! Serving prometheus-client registries over HTTP, shared by the agent and the extender.

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use prometheus_client::registry::Registry;

/// The content type prometheus-client's text encoder writes.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Encodes a registry as an HTTP response for `/metrics`.
pub fn render(registry: &Registry) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => ([(CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
