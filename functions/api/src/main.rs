//! The app API Lambda: an app reads its customers' billing state and spends their allowance
//! (`/v1/accounts/{source}/{customer}[/usage]`, docs/api.md).

use lambda_http::{run, service_fn, Body, Error, Request, RequestExt, Response};
use shared::handlers::api::ApiState;
use shared::platform::config::{ApiConfig, FromEnv};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    // Configuration, the keys and the clients are built once per cold start; a bad variable
    // or an unreadable keys secret stops here, with a message that names it.
    let config = ApiConfig::from_env()?;
    let state = ApiState::from_config(&config).await?;
    run(service_fn(|request| handler(&state, request))).await
}

pub(crate) async fn handler(state: &ApiState, request: Request) -> Result<Response<Body>, Error> {
    let until = shared::handlers::invocation_deadline(request.lambda_context().deadline);
    Ok(shared::handlers::api::handle(state, request, until).await)
}
