//! Meter report commands: `meters [--status S] [--source S --customer C]`, `meters replay
//! <id>… | --dead [--source S]`, `meters audit [--source S]` (docs/design.md §4.13, §4.13a).

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use comfy_table::{ColumnConstraint, Width};
use serde_json::json;
use sqlx::PgPool;

use shared::domain::CustomerId;
use shared::meters::outbox::{self, ReportStatus};
use shared::meters::{audit, Meters};
use shared::platform::config::parse_sources;

use crate::show::{opt, print_json, table};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MetersArgs {
    #[command(subcommand)]
    action: Option<MetersAction>,
    /// Only reports in this status (pending, sent, dead, withdrawn).
    #[arg(long)]
    status: Option<String>,
    /// Only this account's reports: its source...
    #[arg(long, requires = "customer")]
    source: Option<String>,
    /// ...and its customer id.
    #[arg(long, requires = "source")]
    customer: Option<String>,
    #[arg(long, default_value_t = 50)]
    limit: i64,
}

#[derive(Subcommand)]
enum MetersAction {
    /// Put dead reports back to `pending` with fresh attempts and send them again; a report
    /// whose send may have reached the provider is first resent under its dedupe key or read
    /// back, unless `--not-held`.
    Replay {
        /// Report ids to replay.
        ids: Vec<String>,
        /// Replay every dead report.
        #[arg(long, conflicts_with = "ids")]
        dead: bool,
        /// With --dead: only this source's reports.
        #[arg(long, requires = "dead")]
        source: Option<String>,
        /// The provider was seen not to hold them: send without reading back first.
        #[arg(long)]
        not_held: bool,
        /// The dispatcher's queue (unset: the scheduler's rescue sends them at its next run).
        #[arg(long, env = "EFFECTS_QUEUE_URL")]
        queue_url: Option<String>,
    },
    /// Compare the reports sent with each provider's meter total now; exit 1 if any differs.
    Audit {
        /// Only this source.
        #[arg(long)]
        source: Option<String>,
        /// The sources, as the functions read them (their meters and API keys).
        #[arg(long, env = "INBOX_SOURCES", hide_env_values = true)]
        sources: String,
        /// Accounts (with a meter and a month) compared at most.
        #[arg(long, default_value_t = audit::MAX_CHECKED_PER_RUN)]
        max: i64,
    },
}

/// The meter audit found differences: its output says which, the exit code that it did.
#[derive(Debug, thiserror::Error)]
#[error("{0} meter difference(s) open")]
pub struct Differ(pub usize);

fn parse_status(raw: &str) -> anyhow::Result<ReportStatus> {
    ReportStatus::parse(raw).ok_or_else(|| {
        anyhow::anyhow!("unknown report status '{raw}' (pending, sent, dead, withdrawn)")
    })
}

pub async fn run(args: &MetersArgs, pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    match &args.action {
        Some(MetersAction::Replay {
            ids,
            dead,
            source,
            not_held,
            queue_url,
        }) => {
            let named = if *dead { None } else { Some(ids.as_slice()) };
            replay(
                pool,
                named,
                source.as_deref(),
                *not_held,
                queue_url.as_deref(),
                json_output,
            )
            .await
        }
        Some(MetersAction::Audit {
            source,
            sources,
            max,
        }) => run_audit(pool, source.as_deref(), sources, *max, json_output).await,
        None => list(pool, args, json_output).await,
    }
}

async fn list(pool: &PgPool, args: &MetersArgs, json_output: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=10_000).contains(&args.limit),
        "--limit must be between 1 and 10000"
    );
    let status = args.status.as_deref().map(parse_status).transpose()?;
    let customer = args
        .customer
        .as_deref()
        .map(CustomerId::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--customer: {e}"))?;
    let account = args.source.as_deref().zip(customer.as_ref());
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let reports = outbox::list(&mut conn, status, account, args.limit).await?;
    if json_output {
        return print_json(&reports);
    }
    let mut t = table(&["report", "account", "value", "status, tries", "error"]);
    // A report's id whole (36 characters and the padding): `meters replay` takes it.
    if let Some(column) = t.column_mut(0) {
        column.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(38)));
    }
    for r in &reports {
        let error = match (&r.last_error, &r.provider_error) {
            (_, Some(provider)) => format!("provider: {provider}"),
            (Some(last), None) => last.clone(),
            (None, None) => "-".to_owned(),
        };
        // A correction takes its report's value back: shown negative, with the way.
        let value = match (&r.corrects, &r.how) {
            (Some(corrects), how) => format!(
                "-{} ({})\n{}\ncorrects {corrects}",
                r.value,
                how.as_deref().unwrap_or("way not chosen yet"),
                r.period
            ),
            (None, _) => format!("{}\n{}", r.value, r.period),
        };
        t.add_row(vec![
            format!("{}\n{}", r.id, crate::show::when(&r.occurred_at)),
            format!("{}/{}\n{}", r.source, r.customer_id, r.meter),
            value,
            format!(
                "{}, tries {}{}\nsent {}",
                r.status,
                r.attempts,
                if r.unanswered { ", unanswered" } else { "" },
                opt(&r.sent_at.as_ref().map(crate::show::when))
            ),
            error,
        ]);
    }
    out!("{t}");
    Ok(())
}

/// Replays the reports named (`ids`), or every dead one (of `source`). Named reports that are
/// unknown or not dead are said, and make the exit code 1 (the others are still replayed).
async fn replay(
    pool: &PgPool,
    ids: Option<&[String]>,
    source: Option<&str>,
    not_held: bool,
    queue_url: Option<&str>,
    json_output: bool,
) -> anyhow::Result<()> {
    let ids = match ids {
        None => outbox::ids_with_status(pool, ReportStatus::Dead, source).await?,
        Some([]) => anyhow::bail!("name report ids to replay, or --dead"),
        Some(ids) => ids.to_vec(),
    };
    let queue = match queue_url {
        Some(url) => Some(shared::platform::queue::Queue::from_env(url.to_owned()).await),
        None => None,
    };
    let replayed = outbox::replay(pool, queue.as_ref(), &ids, not_held).await?;
    let left: Vec<String> = ids
        .iter()
        .filter(|id| !replayed.contains(id))
        .cloned()
        .collect();
    let known = outbox::statuses(pool, &left).await?;
    let unknown: Vec<&String> = left
        .iter()
        .filter(|id| !known.iter().any(|(k, _)| k == *id))
        .collect();
    let not_dead: Vec<String> = known
        .iter()
        .map(|(id, status)| format!("{id} ({status})"))
        .collect();
    if json_output {
        out!(
            "{}",
            json!({"replayed": replayed, "unknown": unknown, "not_dead": known
                .iter().map(|(id, status)| json!({"id": id, "status": status})).collect::<Vec<_>>(),
                "enqueued": queue.is_some()})
        );
    } else {
        out!("replayed {} report(s): {replayed:?}", replayed.len());
        if !replayed.is_empty() && queue.is_none() {
            out!("EFFECTS_QUEUE_URL is not set: the scheduler's rescue sends them at its next run");
        }
    }
    let mut problems = Vec::new();
    if !unknown.is_empty() {
        problems.push(format!("no such report: {unknown:?}"));
    }
    if !not_dead.is_empty() {
        problems.push(format!(
            "not dead (only a dead report is replayed): {not_dead:?}"
        ));
    }
    if !problems.is_empty() {
        anyhow::bail!("{}", problems.join("; "));
    }
    Ok(())
}

async fn run_audit(
    pool: &PgPool,
    source: Option<&str>,
    sources: &str,
    max: i64,
    json_output: bool,
) -> anyhow::Result<()> {
    let sources = parse_sources(sources).map_err(|e| anyhow::anyhow!("INBOX_SOURCES: {e}"))?;
    shared::providers::check_sources(&sources)?;
    if let Some(source) = source {
        anyhow::ensure!(
            sources.iter().any(|s| s.name == source),
            "no source '{source}' in INBOX_SOURCES"
        );
    }
    let sources = shared::platform::secrets::resolve(
        &sources,
        shared::platform::secrets::Needs::ApiKey,
        shared::platform::secrets::OnFailure::Stop,
    )
    .await?;
    let http = reqwest::Client::builder()
        .timeout(shared::meters::SEND_TIMEOUT)
        .build()
        .context("building the HTTP client")?;
    // The audit reads through the sources' budgets, as the scheduler's does.
    let client = shared::providers::ApiClient::budgeted(
        &http,
        shared::platform::budget::Budgets::new(pool.clone()),
        shared::platform::budget::Lane::Reads,
    );
    let meters = Meters::build(&sources, &client);
    anyhow::ensure!(
        !meters.is_empty(),
        "no source has a meter and an API key: nothing to compare"
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    let found = audit::run(pool, &meters, source, max, deadline).await?;
    if json_output {
        print_json(&found)?;
    } else {
        out!(
            "compared {} account(s) ({} not settled yet, {} whose provider cannot be read); \
             {} new difference(s), {} resolved",
            found.checked,
            found.unsettled,
            found.unreadable,
            found.new,
            found.resolved
        );
        for error in &found.errors {
            out!("not read: {error}");
        }
        if !found.differences.is_empty() {
            let mut t = table(&["account", "meter, period", "ours", "theirs", "seen"]);
            for d in &found.differences {
                t.add_row(vec![
                    format!("{}/{}", d.source, d.customer_id),
                    format!("{}\n{}", d.meter, d.period),
                    d.ours.to_string(),
                    d.theirs.to_string(),
                    format!(
                        "{}\n{}",
                        crate::show::when(&d.first_seen_at),
                        crate::show::when(&d.last_seen_at)
                    ),
                ]);
            }
            out!("{t}");
        }
    }
    if !found.differences.is_empty() {
        return Err(Differ(found.differences.len()).into());
    }
    Ok(())
}
