//! The audit over many accounts (docs/design.md §4.11): the scheduler's bounded run, which
//! records each difference and logs it the first time it is seen (`run`), and `inboxctl
//! audit`'s walk (`audit_all`).

use std::collections::BTreeSet;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};

use crate::domain::{Catalog, CustomerId};
use crate::platform::db::exec;

use super::fold_io::{audit_account, Audited, Divergence, Sources};

/// What one audit run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditReport {
    pub checked: u64,
    pub skipped: u64,
    pub divergent: Vec<Divergence>,
    /// Of `divergent`, those not seen by an earlier run (logged now).
    pub new: u64,
    /// Whether the walk over all accounts reached its end in this run.
    pub wrapped: bool,
}

/// Accounts the scheduler's audit takes per run at most.
pub const MAX_AUDITED_PER_RUN: i64 = 500;

/// The scheduler's audit: the accounts with a difference recorded and those whose log moved
/// since the last run first (half of `max` at most), then the next accounts of a walk over
/// all of them in key order, within `deadline` and `max` accounts; each difference is
/// recorded, and logged the first time it is seen.
pub async fn run(
    pool: &PgPool,
    sources: &Sources,
    catalog: &Catalog,
    deadline: Instant,
    max: i64,
) -> anyhow::Result<AuditReport> {
    let mut conn = pool.acquire().await.context("audit: a connection")?;
    let names: Vec<String> = sources.keys().cloned().collect();
    let started = sqlx::query_scalar!(r#"SELECT inbox_now() AS "now!""#)
        .fetch_one(exec(&mut *conn))
        .await?;
    let position =
        sqlx::query!("SELECT touched_since, after_source, after_customer FROM audit_position")
            .fetch_optional(exec(&mut *conn))
            .await?;
    let (since, after) = match position {
        Some(p) => (p.touched_since, p.after_source.zip(p.after_customer)),
        None => (None, None),
    };
    // Half of the run at most goes to the accounts taken first, so that the walk moves on
    // however many accounts the traffic touches.
    let first_max = max / 2;
    // A recorded difference is checked again every run: the run counts it for as long as it
    // lasts (the alarm stays raised), and its row goes in the first run that finds it gone.
    let recorded = sqlx::query!(
        r#"
        SELECT DISTINCT source, customer_id FROM audit_divergences
        WHERE source = ANY($1) ORDER BY source, customer_id LIMIT $2
        "#,
        &names,
        first_max,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    let mut first: Vec<(String, String)> = recorded
        .into_iter()
        .map(|r| (r.source, r.customer_id))
        .collect();
    // A log line is stamped with its transaction's start, which may come before the last
    // run's start and commit after its snapshot: a minute's overlap (the worker's timeout
    // bounds its transaction) takes those accounts too. The oldest lines first, 20 per
    // account wanted at most, so that the plan reads the log by time whatever its size.
    let touched = sqlx::query!(
        r#"
        SELECT source AS "source!", customer_id AS "customer_id!"
        FROM (SELECT source, customer_id FROM account_log
              WHERE logged_at >= $1::timestamptz - interval '1 minute' AND source = ANY($2)
              ORDER BY logged_at LIMIT $3::bigint * 20) AS recent
        GROUP BY source, customer_id
        LIMIT $3
        "#,
        since,
        &names,
        (first_max - first.len() as i64).max(0),
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    for r in touched {
        let account = (r.source, r.customer_id);
        if !first.contains(&account) {
            first.push(account);
        }
    }
    let room = (max - first.len() as i64).max(0);
    let (after_source, after_customer) = after.clone().unzip();
    // From the walk's place on, as an index range ('' before every name: the start).
    let walk = sqlx::query!(
        r#"
        SELECT source, customer_id FROM accounts
        WHERE source = ANY($1)
          AND (source, customer_id) > (COALESCE($2::text, ''), COALESCE($3::text, ''))
        ORDER BY source, customer_id
        LIMIT $4
        "#,
        &names,
        after_source,
        after_customer,
        room,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    // The walk reached its end only if it had room and found fewer accounts than that: with
    // none (the touched accounts took the run) its place is kept for the next run.
    let mut report = AuditReport {
        wrapped: room > 0 && (walk.len() as i64) < room,
        ..AuditReport::default()
    };
    let walk: Vec<(String, String)> = walk
        .into_iter()
        .map(|r| (r.source, r.customer_id))
        .collect();
    // The walk's place moves only past the accounts it took in this run, so that the
    // deadline leaves the rest for the next.
    let mut last = after;
    let mut done: BTreeSet<&(String, String)> = BTreeSet::new();
    let queue = first
        .iter()
        .map(|a| (a, false))
        .chain(walk.iter().map(|a| (a, true)));
    for (account, walked) in queue {
        if Instant::now() >= deadline {
            report.wrapped = false;
            break;
        }
        if done.insert(account) {
            audit_one(&mut conn, sources, catalog, account, &mut report).await?;
        }
        if walked {
            last = Some(account.clone());
        }
    }
    let (after_source, after_customer) = match report.wrapped {
        true => (None, None),
        false => last.unzip(),
    };
    sqlx::query!(
        r#"
        INSERT INTO audit_position (id, touched_since, after_source, after_customer, updated_at)
        VALUES (true, $1, $2, $3, inbox_now())
        ON CONFLICT (id) DO UPDATE
            SET touched_since = EXCLUDED.touched_since, after_source = EXCLUDED.after_source,
                after_customer = EXCLUDED.after_customer, updated_at = EXCLUDED.updated_at
        "#,
        started,
        after_source,
        after_customer,
    )
    .execute(exec(&mut *conn))
    .await?;
    Ok(report)
}

/// Audits one account of the scheduler's run into `report`: a failure is logged and counted
/// as skipped, and the run goes on.
async fn audit_one(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    (source, customer): &(String, String),
    report: &mut AuditReport,
) -> anyhow::Result<()> {
    let Ok(id) = CustomerId::parse(customer) else {
        report.skipped += 1;
        return Ok(());
    };
    match audit_account(conn, sources, catalog, (source, &id)).await {
        Ok(Audited::Checked(found)) => {
            report.checked += 1;
            report.new += record(conn, source, customer, &found).await?;
            report.divergent.extend(found);
        }
        Ok(Audited::Skipped(_)) => report.skipped += 1,
        Err(e) => {
            tracing::warn!(source, error = %e, "an account's audit failed; the run goes on");
            report.skipped += 1;
        }
    }
    Ok(())
}

/// Records an account's differences: a new one (or one whose values changed) is logged once,
/// with the account and the field (values are register contents, never payloads); one no
/// longer found is removed. Returns how many were new.
async fn record(
    conn: &mut PgConnection,
    source: &str,
    customer: &str,
    found: &[Divergence],
) -> anyhow::Result<u64> {
    let fields: Vec<&str> = found.iter().map(|d| d.field.as_str()).collect();
    let stored: Vec<Value> = found.iter().map(|d| d.stored.clone()).collect();
    let folded: Vec<Value> = found.iter().map(|d| d.folded.clone()).collect();
    let new = sqlx::query_scalar!(
        r#"
        WITH gone AS (
            DELETE FROM audit_divergences
            WHERE source = $1 AND customer_id = $2 AND NOT (field = ANY($3))
        ), seen AS (
            INSERT INTO audit_divergences AS a (source, customer_id, field, stored, folded)
            SELECT $1, $2, f.field, f.stored, f.folded
            FROM unnest($3::text[], $4::jsonb[], $5::jsonb[]) AS f (field, stored, folded)
            ON CONFLICT (source, customer_id, field) DO UPDATE
                SET last_seen = inbox_now(), stored = EXCLUDED.stored, folded = EXCLUDED.folded
            RETURNING field, (xmax = 0) AS inserted, a.first_seen
        )
        SELECT field AS "field!" FROM seen WHERE inserted
        "#,
        source,
        customer,
        &fields as &[&str],
        &stored,
        &folded,
    )
    .fetch_all(exec(&mut *conn))
    .await
    .context("recording the audit's differences")?;
    for field in &new {
        let d = found.iter().find(|d| &d.field == field);
        tracing::error!(
            source,
            customer_id = customer,
            field = field.as_str(),
            stored = %d.map(|d| d.stored.to_string()).unwrap_or_default(),
            folded = %d.map(|d| d.folded.to_string()).unwrap_or_default(),
            "a register differs from the fold of its account's events"
        );
    }
    Ok(new.len() as u64)
}

/// `inboxctl audit`: every account (or those of one customer), `limit` accounts at most.
pub async fn audit_all(
    pool: &PgPool,
    sources: &Sources,
    catalog: &Catalog,
    customer: Option<&str>,
    limit: Option<i64>,
) -> anyhow::Result<AuditReport> {
    let mut conn = pool.acquire().await?;
    let accounts = sqlx::query!(
        r#"
        SELECT source, customer_id FROM accounts
        WHERE source = ANY($1) AND ($2::text IS NULL OR customer_id = $2)
        ORDER BY source, customer_id LIMIT $3
        "#,
        &sources.keys().cloned().collect::<Vec<_>>(),
        customer,
        limit,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    let mut report = AuditReport {
        wrapped: true,
        ..AuditReport::default()
    };
    for r in accounts {
        let Ok(id) = CustomerId::parse(&r.customer_id) else {
            continue;
        };
        match audit_account(&mut conn, sources, catalog, (&r.source, &id)).await? {
            Audited::Checked(found) => {
                report.checked += 1;
                report.divergent.extend(found);
            }
            Audited::Skipped(_) => report.skipped += 1,
        }
    }
    Ok(report)
}
