//! The API function's handler (docs/design.md §12, docs/api.md): the app's routes
//! (`accounts`), the admin API (`admin`) and the console (`console`), each answered within the
//! invocation's time. Every error is mapped to its status code in one place (`answer`). No
//! SQL and no billing rule lives here.

mod accounts;
mod admin;
mod answer;
mod console;
mod state;

use lambda_http::{Body, Request, Response};
use tokio::time::Instant;

use super::body_bytes;
pub use crate::billing::usage::{MAX_AMOUNT, MAX_KEY_LEN, MAX_NOTE_CHARS};
pub use accounts::feature_body;
use answer::ANSWER_MARGIN;
pub use answer::{
    server_error_metric, ApiError, DEFAULT_BUDGET, DEFAULT_LIMIT, MAX_BODY_BYTES, MAX_LIMIT,
    RETRY_AFTER_SECS,
};
pub use state::{ApiState, Clock, SetClock};

/// Handles one HTTP request within `until` (the invocation's deadline; [`DEFAULT_BUDGET`]
/// from now without one); every outcome is an HTTP answer.
pub async fn handle(state: &ApiState, request: Request, until: Option<Instant>) -> Response<Body> {
    let until = until.map_or_else(
        || Instant::now() + DEFAULT_BUDGET,
        |until| until.checked_sub(ANSWER_MARGIN).unwrap_or(until),
    );
    let answer = match tokio::time::timeout_at(until, serve(state, &request)).await {
        Ok(answer) => answer,
        Err(_) => {
            // A statement cut off mid-way leaves its connection in no known state.
            state.conn.lock().await.discard();
            Err(ApiError::Timeout)
        }
    };
    answer.unwrap_or_else(ApiError::into_response)
}

async fn serve(state: &ApiState, request: &Request) -> Result<Response<Body>, ApiError> {
    let body = body_bytes(request.body());
    if body.len() > MAX_BODY_BYTES {
        return Err(ApiError::PayloadTooLarge(body.len()));
    }
    let path = request.uri().path();
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    if let Some(at) = segments.iter().position(|s| *s == "console") {
        // `{base}/console[/…]`, never a segment of an account's path (those start `/v1`).
        if !segments[..at].contains(&"v1") {
            return Ok(console::serve(state, request, &segments, at).await);
        }
    }
    match segments.windows(2).position(|w| w == ["v1", "admin"]) {
        Some(at) => {
            let route = admin::route(request.method(), path, &segments[at + 2..])?;
            admin::serve(state, request, route, body).await
        }
        None => accounts::serve(state, request, body).await,
    }
}
