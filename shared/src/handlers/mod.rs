//! Handlers: what each Lambda function does with its event — adapt the Lambda event,
//! orchestrate the layers below (the worker's algorithm is `apply`), map errors to answers.
//! No SQL and no billing rule lives here (docs/design.md §2). The function crates under
//! `functions/` only build their state once and call these.

pub mod api;
pub mod bridge;
pub mod dispatcher;
pub mod engine_room;
pub mod intake;
pub mod migrate;
pub mod scheduler;
pub mod worker;

use http::StatusCode;
use lambda_http::{Body, Response};
use serde_json::Value;

/// A JSON answer of the HTTP functions (the intake's and the app API's).
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::Text(body.to_string()))
        .expect("a static status and header always build a response")
}

/// A request's body as bytes, however API Gateway or the function URL carried it.
pub(crate) fn body_bytes(body: &Body) -> &[u8] {
    match body {
        Body::Empty => &[],
        Body::Text(text) => text.as_bytes(),
        Body::Binary(bytes) => bytes,
        _ => &[],
    }
}

/// The invocation's end (Lambda's deadline, milliseconds since the epoch) as an instant;
/// `None` when it is not set, or already past as the invocation starts (`cargo lambda
/// watch` sends such a deadline; Lambda's is the function's timeout from now).
pub fn invocation_deadline(deadline_ms: u64) -> Option<tokio::time::Instant> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let left = std::time::Duration::from_millis(deadline_ms).checked_sub(now)?;
    (!left.is_zero()).then(|| tokio::time::Instant::now() + left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_that_is_unset_or_already_past_bounds_nothing() {
        assert!(invocation_deadline(0).is_none());
        assert!(invocation_deadline(1_000).is_none());
        let in_a_minute = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            + 60_000;
        let until = invocation_deadline(in_a_minute).expect("a deadline ahead");
        let left = until - tokio::time::Instant::now();
        assert!(left > std::time::Duration::from_secs(50), "{left:?}");
    }
}
