//! Handlers: what each Lambda function does with its event — adapt the Lambda event,
//! orchestrate the inbox, billing and provider layers, map errors to answers. No SQL and no
//! billing rule lives here (docs/design.md §2). The function crates under `functions/` only
//! build their state once and call these.

pub mod dispatcher;
pub mod intake;
pub mod scheduler;
pub mod worker;
