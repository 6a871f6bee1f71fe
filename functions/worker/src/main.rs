//! The worker Lambda: applies stored events named by SQS messages, one transaction each.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use shared::handlers::worker::WorkerState;
use shared::platform::config::{FromEnv, WorkerConfig};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = shared::platform::telemetry::init("worker");
    let config = WorkerConfig::from_env()?;
    // One event at a time per instance; the event source mapping's maximum concurrency
    // bounds the connections all instances hold together.
    let state = WorkerState::from_config(&config, 2).await?;
    run(service_fn(|event| {
        telemetry.invocation(handler(&state, event))
    }))
    .await
}

pub(crate) async fn handler(
    state: &WorkerState,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, Error> {
    let until = shared::handlers::invocation_deadline(event.context.deadline);
    Ok(shared::handlers::worker::handle_batch_until(state, event.payload, until).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::event::sqs::SqsMessage;
    use lambda_runtime::Context;

    #[tokio::test]
    async fn a_message_that_names_no_event_is_dropped_not_retried() {
        // No database is reached: the body is rejected before any claim.
        let pool =
            shared::platform::db::lazy_pool("postgres://nobody@127.0.0.1:1/none", 1).unwrap();
        let state = WorkerState::new(pool, Default::default(), Default::default());
        let mut message = SqsMessage::default();
        message.message_id = Some("m-1".into());
        message.body = Some("not an event id".into());
        let mut event = SqsEvent::default();
        event.records.push(message);

        let response = handler(&state, LambdaEvent::new(event, Context::default()))
            .await
            .unwrap();

        assert!(response.batch_item_failures.is_empty());
    }
}
