//! Handlers: what each Lambda function does with its event — adapt the Lambda event,
//! orchestrate the layers below (the worker's algorithm is `apply`), map errors to answers.
//! No SQL and no billing rule lives here (docs/design.md §2). The function crates under
//! `functions/` only build their state once and call these.

pub mod dispatcher;
pub mod intake;
pub mod scheduler;
pub mod worker;
