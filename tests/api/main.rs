//! Integration tests against real Postgres and a real SQS-compatible server.
//!
//! Each test gets its own database (`#[sqlx::test]`) and its own queue.

mod app_api;
mod audit;
mod bridge;
mod cli;
mod console;
mod corpus;
mod database;
mod effects;
mod effects_dispatch;
mod ends;
mod engine_room;
mod feature_check;
mod features;
mod fold;
mod fuzz;
mod health;
mod helpers;
mod intake;
mod kinde_reconcile;
mod meter_audit;
mod meters;
mod migrate;
mod model;
mod operations;
mod order;
mod paddle_reconcile;
mod polar_benefits;
mod pooler;
mod reconcile;
mod reversals;
mod round_trips;
mod scale;
mod scenarios;
mod scheduler;
mod secrets;
mod sim;
mod sqs_calls;
mod stripe_entitlements;
mod subscription_read;
mod thin;
mod traffic;
mod usage;
mod why;
mod worker_faults;
