//! The intake Lambda: verifies, stores and enqueues webhook deliveries (`POST /webhooks/{source}`).

use lambda_http::{run, service_fn, Body, Error, Request, Response};
use shared::handlers::intake::IntakeState;
use shared::platform::config::{FromEnv, IntakeConfig};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = shared::platform::telemetry::init("intake");
    // Configuration and clients are built once per cold start; a bad variable stops here,
    // with a message that names it.
    let config = IntakeConfig::from_env()?;
    let state = IntakeState::from_config(&config).await?;
    run(service_fn(|request| {
        telemetry.invocation(handler(&state, request))
    }))
    .await
}

pub(crate) async fn handler(
    state: &IntakeState,
    request: Request,
) -> Result<Response<Body>, Error> {
    Ok(shared::handlers::intake::handle(state, request).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::platform::config::parse_sources;
    use shared::platform::queue::Queue;
    use shared::providers::Sources;

    #[tokio::test]
    async fn an_unknown_source_is_404_before_any_io() {
        let sqs = aws_sdk_sqs::Client::from_conf(
            aws_sdk_sqs::Config::builder()
                .behavior_version_latest()
                .region(aws_sdk_sqs::config::Region::new("us-east-1"))
                .build(),
        );
        let sources =
            parse_sources(r#"[{"name":"stripe","kind":"stripe","secrets":["whsec_x"]}]"#).unwrap();
        let state = IntakeState::new(
            shared::platform::db::lazy_pool("postgres://nobody@127.0.0.1:1/none", 1).unwrap(),
            Queue::new(sqs, "http://127.0.0.1:1/000000000000/none"),
            Sources::build(
                &sources,
                std::time::Duration::from_secs(300),
                reqwest_client(),
            )
            .unwrap(),
        );
        // The event a Lambda function URL sends (what `cargo lambda watch` serves too).
        let request = lambda_http::request::from_str(
            r#"{"version":"2.0","rawPath":"/webhooks/paypal","rawQueryString":"","headers":{},
                "requestContext":{"http":{"method":"POST","path":"/webhooks/paypal"},"timeEpoch":0},
                "body":"{}","isBase64Encoded":false}"#,
        )
        .unwrap();

        let response = handler(&state, request).await.unwrap();

        assert_eq!(response.status(), 404);
    }

    fn reqwest_client() -> reqwest::Client {
        reqwest::Client::new()
    }
}
