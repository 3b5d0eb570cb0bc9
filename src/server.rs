//! HTTP: the XRPC endpoints on axum.
//!
//! Invariants:
//! - The public listener has no mutating endpoint.
//! - Every error is an XRPC error body `{"error", "message"}` with a 4xx/5xx status.

use crate::index::Index;
use crate::query::{ListParams, QueryError, list_backlinks};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;

pub const LIST_BACKLINKS: &str = "/xrpc/blue.cerulea.backlinks.listBacklinks";

pub fn router(index: Arc<Index>) -> Router {
    Router::new()
        .route(LIST_BACKLINKS, get(list_handler))
        .route("/xrpc/_health", get(health_handler))
        .fallback(not_found)
        .with_state(index)
}

/// An XRPC error response.
pub struct XrpcError {
    status: StatusCode,
    error: &'static str,
    message: String,
}

impl IntoResponse for XrpcError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.error, "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

impl From<QueryError> for XrpcError {
    fn from(e: QueryError) -> Self {
        match e {
            QueryError::InvalidRequest(message) => {
                XrpcError { status: StatusCode::BAD_REQUEST, error: "InvalidRequest", message }
            }
            QueryError::Internal(message) => {
                tracing::error!(%message, "query failed");
                XrpcError { status: StatusCode::INTERNAL_SERVER_ERROR, error: "InternalServerError", message }
            }
        }
    }
}

/// Parses a raw query string into validated listBacklinks parameters.
pub fn parse_list_query(raw: Option<&str>) -> Result<ListParams, QueryError> {
    let pairs: Vec<(String, String)> =
        form_urlencoded::parse(raw.unwrap_or("").as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    ListParams::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

async fn list_handler(
    State(index): State<Arc<Index>>,
    RawQuery(raw): RawQuery,
) -> Result<Json<serde_json::Value>, XrpcError> {
    let params = parse_list_query(raw.as_deref())?;
    let page = list_backlinks(&index, &params).await?;
    Ok(Json(page.to_json()))
}

async fn health_handler(State(index): State<Arc<Index>>) -> Json<serde_json::Value> {
    let position = index.position();
    Json(serde_json::json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "clock": position.clock,
        "cursor": position.cursor,
    }))
}

async fn not_found() -> XrpcError {
    XrpcError { status: StatusCode::NOT_FOUND, error: "MethodNotImplemented", message: "no such endpoint".into() }
}
