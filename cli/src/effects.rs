//! Effect commands: `effects [--status S]`, `effect <id>`, `effects replay <id>… | --status S`.

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use sqlx::PgPool;

use shared::effects::outbox::{self, EffectStatus};

use crate::show::{opt, print_json, table};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct EffectsArgs {
    #[command(subcommand)]
    action: Option<EffectsAction>,
    /// Only effects in this status (pending, sent, dead).
    #[arg(long)]
    status: Option<String>,
    #[arg(long, default_value_t = 50)]
    limit: i64,
}

#[derive(Subcommand)]
enum EffectsAction {
    /// Put effects back to `pending` with fresh attempts and enqueue them; the app dedupes a
    /// second delivery by its `webhook-id`.
    Replay {
        /// Effect ids to replay.
        ids: Vec<String>,
        /// Replay every effect in this status (e.g. dead).
        #[arg(long, conflicts_with = "ids")]
        status: Option<String>,
        /// The dispatcher's queue.
        #[arg(long, env = "EFFECTS_QUEUE_URL")]
        queue_url: String,
    },
}

fn parse_status(raw: &str) -> anyhow::Result<EffectStatus> {
    EffectStatus::parse(raw)
        .ok_or_else(|| anyhow::anyhow!("unknown effect status '{raw}' (pending, sent, dead)"))
}

pub async fn run(args: &EffectsArgs, pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    match &args.action {
        Some(EffectsAction::Replay {
            ids,
            status,
            queue_url,
        }) => replay(pool, ids, status.as_deref(), queue_url, json_output).await,
        None => list(pool, args.status.as_deref(), args.limit, json_output).await,
    }
}

async fn list(
    pool: &PgPool,
    status: Option<&str>,
    limit: i64,
    json_output: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=10_000).contains(&limit),
        "--limit must be between 1 and 10000"
    );
    let status = status.map(parse_status).transpose()?;
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let effects = outbox::list(&mut conn, status, limit).await?;
    if json_output {
        return print_json(&effects);
    }
    let mut t = table(&["effect", "account, sequence", "status, created", "event"]);
    for e in &effects {
        t.add_row(vec![
            format!("{}\n{}", e.id, e.kind),
            format!("{}/{}\nsequence {}", e.source, e.customer_id, e.sequence),
            format!(
                "{}, tries {}\n{}",
                e.status,
                e.attempts,
                crate::show::when(&e.created_at)
            ),
            opt(&e.event_id),
        ]);
    }
    out!("{t}");
    Ok(())
}

pub async fn show(pool: &PgPool, id: &str, json_output: bool) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let e = outbox::detail(&mut conn, id)
        .await?
        .with_context(|| format!("no effect {id}"))?;
    if json_output {
        return print_json(&e);
    }
    out!("effect {} ({})", e.id, e.kind);
    out!("cause       {}", e.cause);
    out!(
        "customer    {} ({}), sequence {}",
        e.customer_id,
        e.source,
        e.sequence
    );
    match e.event_id {
        Some(event_id) => out!("event       {event_id} at {}", e.occurred_at.to_rfc3339()),
        None => out!("debit       at {}", e.occurred_at.to_rfc3339()),
    }
    out!("status      {} after {} attempt(s)", e.status, e.attempts);
    out!(
        "sent to     {}",
        if e.sent_to.is_empty() {
            "-".to_owned()
        } else {
            e.sent_to.join(", ")
        }
    );
    out!("last error  {}", opt(&e.last_error));
    out!(
        "next try    {}",
        e.next_attempt_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_default()
    );
    out!("created     {}", e.created_at.to_rfc3339());
    out!(
        "sent        {}",
        e.sent_at.map(|t| t.to_rfc3339()).unwrap_or_default()
    );
    out!("body        {}", serde_json::to_string_pretty(&e.body)?);
    Ok(())
}

async fn replay(
    pool: &PgPool,
    ids: &[String],
    status: Option<&str>,
    queue_url: &str,
    json_output: bool,
) -> anyhow::Result<()> {
    let ids = match status {
        Some(status) => outbox::ids_with_status(pool, parse_status(status)?).await?,
        None if ids.is_empty() => anyhow::bail!("name effect ids to replay, or --status"),
        None => ids.to_vec(),
    };
    let queue = shared::platform::queue::Queue::from_env(queue_url.to_owned()).await;
    let replayed = outbox::replay(pool, &queue, &ids).await?;
    let skipped: Vec<&String> = ids.iter().filter(|id| !replayed.contains(id)).collect();
    if json_output {
        out!("{}", json!({"replayed": replayed, "skipped": skipped}));
    } else {
        out!("replayed {} effect(s): {replayed:?}", replayed.len());
        if !skipped.is_empty() {
            out!("skipped (unknown, or held by a dispatcher right now): {skipped:?}");
        }
    }
    if !ids.is_empty() && replayed.is_empty() {
        anyhow::bail!("no effect was replayed");
    }
    Ok(())
}
