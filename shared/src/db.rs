//! The Postgres pool, built once per cold start.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// A pool that connects on first use, so that a function starts (and answers 503) while
/// Postgres is down, and gives up on a connection quickly instead of holding the caller.
pub fn lazy_pool(database_url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let options = PgConnectOptions::from_str(database_url)?;
    Ok(pool_options(max_connections).connect_lazy_with(options))
}

pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(3))
        // Lambda freezes idle instances; a connection found dead is replaced, not used.
        .test_before_acquire(true)
        .idle_timeout(Duration::from_secs(300))
}
