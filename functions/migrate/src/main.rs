//! The migrate Lambda: the stack's `Custom::SchemaMigrations` resource, which applies the
//! migrations on every deploy and answers CloudFormation (docs/design.md §7.1).

use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;
use shared::handlers::migrate::MigrateState;
use shared::platform::config::Env;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let telemetry = shared::platform::telemetry::init("migrate");
    // Read once per cold start; an error here is every request's FAILED reason, not a
    // function that cannot start (CloudFormation would hear nothing until its timeout).
    let state = MigrateState::new(Env::process().database());
    run(service_fn(|event| {
        telemetry.invocation(handler(&state, event))
    }))
    .await
}

pub(crate) async fn handler(state: &MigrateState, event: LambdaEvent<Value>) -> Result<(), Error> {
    let deadline = shared::handlers::invocation_deadline(event.context.deadline);
    shared::handlers::migrate::handle(state, event.payload, deadline).await?;
    Ok(())
}
