//! The app API Lambda: an app reads its customers' billing state and spends their allowance
//! (`/v1/accounts/{source}/{customer}[/usage]`, docs/api.md).

use lambda_http::{run, service_fn, Body, Error, Request, RequestExt, Response};
use shared::handlers::api::ApiState;
use shared::platform::config::{ApiConfig, FromEnv};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = shared::platform::telemetry::init("api");
    // Configuration, the keys and the clients are built once per cold start; a bad variable
    // or an unreadable keys secret stops here, with a message that names it.
    let config = ApiConfig::from_env()?;
    let state = ApiState::from_config(&config).await?;
    // The state keeps each source's name, kind, mode and meter; the sources as written (an
    // inline key, locally) go with the configuration.
    drop(config);
    run(service_fn(|request| {
        telemetry.invocation(handler(&state, request))
    }))
    .await
}

pub(crate) async fn handler(state: &ApiState, request: Request) -> Result<Response<Body>, Error> {
    let until = shared::handlers::invocation_deadline(request.lambda_context().deadline);
    Ok(shared::handlers::api::handle(state, request, until).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/operating.md lets a source keep its API key inline for local use: the api starts
    /// with a metered source whose key is inline, as every other function does (it sends no
    /// report itself, but the providers' rules are one rule, checked on the sources as
    /// written).
    #[tokio::test]
    async fn the_api_starts_with_a_metered_source_whose_key_is_inline() {
        let config = ApiConfig::from_lookup(|var| {
            Some(match var {
                // Nothing connects before the first request.
                "DATABASE_URL" => "postgres://nobody@127.0.0.1:1/none".to_owned(),
                "INBOX_SOURCES" => r#"[{"name":"stripe","kind":"stripe","secrets":["whsec_x"],
                    "api_key":"sk_test_inline","meter":{"event_name":"api_calls"}}]"#
                    .to_owned(),
                "INBOX_PLANS" => r#"{"price_pro":{"plan":"pro","monthly_allowance":500}}"#.to_owned(),
                "INBOX_API_KEYS" => r#"[{"name":"app","sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["read","usage"]}]"#.to_owned(),
                _ => return None,
            })
        })
        .unwrap();

        let state = ApiState::from_config(&config).await;

        let state = state.map_err(|e| e.to_string()).unwrap();
        assert_eq!(state.meters["stripe"], "api_calls");
    }
}
