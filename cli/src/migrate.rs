//! `inboxctl migrate`: the migrations applied to the database, and which were new.

use anyhow::Context;
use serde_json::json;
use sqlx::PgPool;

pub async fn run(pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let before = applied_versions(pool).await?;
    shared::MIGRATOR
        .run(pool)
        .await
        .context("applying migrations")?;
    let after = applied_versions(pool).await?;
    let new: Vec<i64> = after
        .iter()
        .copied()
        .filter(|v| !before.contains(v))
        .collect();
    if json_output {
        out!("{}", json!({"applied": new, "total": after.len()}));
    } else if new.is_empty() {
        out!("schema is up to date ({} migrations)", after.len());
    } else {
        out!(
            "applied {} migration(s): {:?}; {} in all",
            new.len(),
            new,
            after.len()
        );
    }
    Ok(())
}

/// Versions recorded by earlier runs; none when the table does not exist yet.
async fn applied_versions(pool: &PgPool) -> anyhow::Result<Vec<i64>> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await
        .context("reading the migration table")?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
        .fetch_all(pool)
        .await
        .context("reading the migration table")
}
