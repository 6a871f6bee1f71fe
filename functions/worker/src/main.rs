//! The worker Lambda: applies stored events named by SQS messages, one transaction each.

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use inbox::worker::{WorkerConfig, WorkerState};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = WorkerConfig::from_env()?;
    // One event at a time per instance; the event source mapping's maximum concurrency
    // bounds the connections all instances hold together.
    let state = WorkerState::from_config(&config, 2)?;
    run(service_fn(|event| handler(&state, event))).await
}

pub(crate) async fn handler(
    state: &WorkerState,
    event: LambdaEvent<SqsEvent>,
) -> Result<SqsBatchResponse, Error> {
    Ok(inbox::worker::handle_batch(state, event.payload).await)
}
