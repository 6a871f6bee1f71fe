//! The scheduler Lambda, run by an EventBridge schedule: rescue, alerts, reconciliation, purge.

use aws_lambda_events::event::cloudwatch_events::CloudWatchEvent;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;
use shared::handlers::scheduler::SchedulerState;
use shared::platform::config::{FromEnv, SchedulerConfig};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = shared::platform::telemetry::init("scheduler");
    let config = SchedulerConfig::from_env()?;
    let state = SchedulerState::from_config(&config).await?;
    run(service_fn(|event| {
        telemetry.invocation(handler(&state, event))
    }))
    .await
}

pub(crate) async fn handler(
    state: &SchedulerState,
    event: LambdaEvent<CloudWatchEvent>,
) -> Result<Value, Error> {
    tracing::info!(time = ?event.payload.time, "scheduled run");
    let report = shared::handlers::scheduler::run(state).await;
    Ok(serde_json::to_value(report)?)
}
