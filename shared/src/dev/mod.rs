//! Development tools, compiled only with the `dev` feature (on for `inboxctl` and the tests,
//! off for the Lambda functions): the local stand-ins for what AWS does between the functions.
//! Realistic payloads and the test-delivery signers live with their provider
//! (`providers::<name>::fixtures`, `providers::fixtures`).

pub mod lambda_triggers;
pub mod listen;
