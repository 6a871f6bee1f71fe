//! The dispatcher Lambda: delivers the effects named by SQS messages to the configured sinks.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use shared::handlers::dispatcher::DispatcherState;
use shared::platform::config::{DispatcherConfig, FromEnv};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = shared::platform::telemetry::init("dispatcher");
    let config = DispatcherConfig::from_env()?;
    // The sinks' signing secrets are read here, once per cold start.
    let state = DispatcherState::from_config(&config, 2).await?;
    run(service_fn(|event| {
        telemetry.invocation(handler(&state, event))
    }))
    .await
}

pub(crate) async fn handler(
    state: &DispatcherState,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, Error> {
    let until = shared::handlers::invocation_deadline(event.context.deadline);
    Ok(shared::handlers::dispatcher::handle_batch_until(state, event.payload, until).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::event::sqs::SqsMessage;
    use lambda_runtime::Context;

    #[tokio::test]
    async fn a_message_that_names_no_effect_is_dropped_not_retried() {
        // No database is reached: the body is rejected before any claim.
        let pool =
            shared::platform::db::lazy_pool("postgres://nobody@127.0.0.1:1/none", 1).unwrap();
        let state = DispatcherState::new(pool, shared::effects::sinks::Sinks::default());
        let mut message = SqsMessage::default();
        message.message_id = Some("m-1".into());
        message.body = Some("not an effect id".into());
        let mut event = SqsEvent::default();
        event.records.push(message);

        let response = handler(&state, LambdaEvent::new(event, Context::default()))
            .await
            .unwrap();

        assert!(response.batch_item_failures.is_empty());
    }
}
