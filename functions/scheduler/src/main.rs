//! The scheduler Lambda: runs on an EventBridge schedule.
//!
//! Rescue, retries, reconciliation and purge are not built yet; a run only records that it ran.

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::{json, Value};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    run(service_fn(handler)).await
}

pub(crate) async fn handler(event: LambdaEvent<CloudWatchEvent>) -> Result<Value, Error> {
    tracing::info!(time = ?event.payload.time, "scheduled run: no steps are implemented yet");
    Ok(json!({"steps": []}))
}
