//! billing-inbox: the library behind the intake, worker and scheduler functions and `inboxctl`.

pub mod config;
pub mod db;
pub mod domain;
pub mod intake;
pub mod providers;
pub mod queue;
pub mod store;

/// The schema, applied by `inboxctl migrate` and by the tests.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
