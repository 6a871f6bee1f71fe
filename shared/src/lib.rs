//! billing-inbox: the library behind the intake, worker and scheduler functions and `inboxctl`.

pub mod account;
pub mod apply;
pub mod billing;
pub mod bridge;
pub mod config;
pub mod db;
pub mod domain;
pub mod fixtures;
pub mod intake;
pub mod ops;
pub mod providers;
pub mod queue;
pub mod reconcile;
pub mod scheduler;
pub mod store;
pub mod worker;

/// The schema, applied by `inboxctl migrate` and by the tests.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
