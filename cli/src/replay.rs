//! `inboxctl replay`: events handed to the worker again, by id or by status.

use anyhow::Context;
use serde_json::json;
use sqlx::PgPool;

pub async fn run(
    pool: &PgPool,
    ids: &[i64],
    status: Option<&str>,
    source: Option<&str>,
    queue_url: &str,
    json_output: bool,
) -> anyhow::Result<()> {
    let ids = match status {
        Some(status) => {
            let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
            let status = crate::show::parse_status(status)?;
            let rows = shared::platform::queued::ROWS_PER_STEP;
            shared::inbox::replay::ids_with_status(&mut conn, status, source, rows).await?
        }
        None if ids.is_empty() => anyhow::bail!("name event ids to replay, or --status"),
        None => ids.to_vec(),
    };
    let queue = shared::platform::queue::Queue::from_env(queue_url.to_owned()).await;
    let replayed = shared::inbox::replay::replay(pool, &queue, &ids).await?;
    let skipped: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !replayed.contains(id))
        .collect();
    if json_output {
        out!("{}", json!({"replayed": replayed, "skipped": skipped}));
    } else {
        out!("replayed {} event(s): {replayed:?}", replayed.len());
        if !skipped.is_empty() {
            out!("skipped (unknown, or held by a worker right now): {skipped:?}");
        }
    }
    if !ids.is_empty() && replayed.is_empty() {
        anyhow::bail!("no event was replayed");
    }
    Ok(())
}
