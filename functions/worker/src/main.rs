//! The worker Lambda: receives stored event ids from SQS.
//!
//! Applying effects is not built yet: every message is reported as a batch item failure, so
//! SQS keeps it and nothing is lost or acknowledged unapplied.

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    run(service_fn(handler)).await
}

pub(crate) async fn handler(event: LambdaEvent<SqsEvent>) -> Result<SqsBatchResponse, Error> {
    let mut response = SqsBatchResponse::default();
    for message in event.payload.records {
        let event_id = message
            .body
            .as_deref()
            .and_then(inbox::queue::parse_message_body);
        tracing::warn!(
            ?event_id,
            "worker effects are not implemented; leaving the message on the queue"
        );
        if let Some(id) = message.message_id {
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        }
    }
    Ok(response)
}
