//! The EventBridge Lambda: Stripe's events from its partner event source, stored and enqueued
//! as the intake stores a verified delivery (docs/design.md §1.1). The rule on the partner
//! bus invokes it; an error is retried by Lambda and then lands in the DLQ.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;
use shared::handlers::bridge::BridgeState;
use shared::platform::config::FromEnv;
use shared::providers::stripe::event_destination::BridgeConfig;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = shared::platform::telemetry::init("bridge");
    // A bad variable (a partner source that is not Stripe's, a source that is not a Stripe
    // source) stops the cold start here, with a message that names it.
    let config = BridgeConfig::from_env()?;
    let state = BridgeState::from_config(&config).await?;
    run(service_fn(|event| {
        telemetry.invocation(handler(&state, event))
    }))
    .await
}

pub(crate) async fn handler(
    state: &BridgeState,
    event: LambdaEvent<EventBridgeEvent>,
) -> Result<Value, Error> {
    Ok(shared::handlers::bridge::handle(state, event.payload).await?)
}
