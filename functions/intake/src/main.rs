//! The intake Lambda: verifies, stores and enqueues webhook deliveries (`POST /webhooks/{source}`).

use inbox::config::IntakeConfig;
use inbox::intake::IntakeState;
use lambda_http::{run, service_fn, Body, Error, Request, Response};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    // Configuration and clients are built once per cold start; a bad variable stops here,
    // with a message that names it.
    let config = IntakeConfig::from_env()?;
    let state = IntakeState::from_config(&config).await?;
    run(service_fn(|request| handler(&state, request))).await
}

pub(crate) async fn handler(
    state: &IntakeState,
    request: Request,
) -> Result<Response<Body>, Error> {
    Ok(inbox::intake::handle(state, request).await)
}
