//! Reconciliation with the providers' APIs (docs/design.md §6): what the webhooks never
//! delivered is fetched and stored through the inbox's own store, so it is deduplicated and
//! ordered like a delivery, then enqueued. Each provider says how it is read (its folder's
//! `api`); this module runs it, keeps the feed cursor and records each run.
//!
//! - An event feed (Stripe): first what the provider failed to deliver, then a walk forward
//!   in time: a window of provider time after the cursor is read page by page, the position
//!   saved after every page, so a run that stops (budget, time, an API error) is resumed by
//!   the next without a gap or a repeat; when the window is read, the cursor moves to its end.
//!   The cursor stays [`LAG`] behind now. A missing event is stored and applied; a present
//!   one is counted apart, and is not a delivery (its copy count does not move).
//! - A subscription sweep (Polar): the provider's current subscriptions; one the local
//!   register shows in an older, different state becomes a corrective event.
//! - A customer sweep (Kinde): the customers with events in the last [`RECENT`], in id order
//!   from a saved position, at most [`MAX_CUSTOMERS`] a run; each one's plan and entitlements
//!   at the provider against its plan and entitlement registers, each difference becoming a
//!   corrective event. A customer whose
//!   read fails is passed over (the sweep goes on) and counted; after [`MAX_READ_FAILURES`]
//!   runs in a row it is skipped, and reported, until [`SKIPPED_FOR`] after its last failure.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::billing::registers::{stored_entitlements, stored_plan, stored_subscription};
use crate::domain::Verdict;
use crate::inbox::enqueue_or_unmark;
use crate::inbox::store::{store_verified, Origin};
use crate::platform::budget::Throttled;
use crate::platform::config::SourceConfig;
use crate::platform::db::exec;
use crate::platform::queue::Queue;
use crate::providers::{
    provider, Api, ApiClient, CustomerPlans, EventFeed, Fetched, Reconciliation, StoredCustomer,
    SubscriptionSweep, Window,
};

/// How far behind now the feed's cursor stays: an event becomes listable a little after it is
/// created, so the walk never reads the last minutes (the next run does).
pub const LAG: Duration = Duration::from_secs(15 * 60);
/// The span of provider time one window of the walk covers.
pub const WINDOW: Duration = Duration::from_secs(6 * 3600);
/// Where the first read starts.
pub const FIRST_LOOKBACK: Duration = Duration::from_secs(3 * 86_400);
/// The most pages one run reads from one source (the walk; then the undelivered list).
pub const MAX_PAGES: u32 = 20;
pub const MAX_UNDELIVERED_PAGES: u32 = 5;
/// The customer sweep reads the customers with events this recent.
pub const RECENT: Duration = Duration::from_secs(35 * 86_400);
/// The most customers one run reads (one API call each); the next run goes on from there.
pub const MAX_CUSTOMERS: i64 = 200;
/// A customer whose read failed this many runs in a row is skipped by the sweep...
pub const MAX_READ_FAILURES: i32 = 3;
/// ...until this long after its last failure, when it is read once more.
pub const SKIPPED_FOR: Duration = Duration::from_secs(86_400);
/// Reads failing in a row, with none answered yet in the run, that stop it: the provider is
/// down, and that is not the customers' doing.
pub const OUTAGE_READS: usize = 3;

/// One source's reconciliation.
pub struct Reconciler {
    source: String,
    how: Reconciliation,
}

impl Reconciler {
    /// The source's reconciliation, when it has an API key and its provider can be
    /// reconciled.
    pub fn for_source(config: &SourceConfig, client: impl Into<ApiClient>) -> Option<Self> {
        let client = client.into();
        let how = Api::for_source(config, &client)
            .and_then(|api| provider(config.kind).reconciliation(api));
        if how.is_none() && config.api_key.is_some() {
            tracing::warn!(source = %config.name, kind = config.kind.as_str(),
                "not reconciled: this kind of source needs more than an api_key \
                 (kinde: api_client_id); api_key ignored");
        }
        Some(Self {
            source: config.name.clone(),
            how: how?,
        })
    }

    /// A reconciliation of `source` read however `how` reads it (the simulator's own feed).
    pub fn new(source: impl Into<String>, how: Reconciliation) -> Self {
        Self {
            source: source.into(),
            how,
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }
}

/// One reconciler per source that can be reconciled; the other sources are skipped.
pub fn reconcilers(sources: &[SourceConfig], client: impl Into<ApiClient>) -> Vec<Reconciler> {
    let client = client.into();
    sources
        .iter()
        .filter_map(|source| Reconciler::for_source(source, &client))
        .collect()
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ReconcileReport {
    pub source: String,
    pub cursor_from: Option<DateTime<Utc>>,
    pub cursor_to: Option<DateTime<Utc>>,
    pub read: i32,
    /// Read and already stored (a read is not a delivery: nothing about the event changes).
    pub already_present: i32,
    pub stored_new: i32,
    /// New events and conflicts: what the webhooks had not brought.
    pub discrepancies: i32,
    /// The run's page or time budget ran out before the walk caught up.
    pub stopped_early: bool,
    /// How far the feed's cursor is behind now, in seconds, after the run.
    pub behind_secs: Option<f64>,
    /// Customers whose read failed this run; the sweep went on past them.
    pub failed: Vec<FailedRead>,
    /// Customers not read this run: their read failed [`MAX_READ_FAILURES`] runs in a row.
    pub skipped: Vec<String>,
    pub error: Option<String>,
}

/// A customer's read that failed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FailedRead {
    pub customer: String,
    /// Runs in a row whose read of this customer failed, this one included.
    pub failures: i32,
    pub error: String,
}

/// Where fetched events go: the inbox store and the queue, within the run's time.
struct Run<'a> {
    source: &'a str,
    pool: &'a PgPool,
    queue: &'a Queue,
    /// Events created since then, if ever stored, are still stored (the purge's
    /// [`kept_since`](crate::inbox::purge::kept_since)): the undelivered list is read no
    /// further back.
    kept_since: DateTime<Utc>,
    deadline: Instant,
    report: ReconcileReport,
    /// New pending events stored since the last flush: sent a page at a time.
    to_enqueue: Vec<i64>,
}

/// Runs one source's reconciliation and records it; an API error fails this source only.
/// `kept_since`: events created since then that this source stored are still stored.
#[tracing::instrument(skip_all, fields(source = reconciler.source()))]
pub async fn run(
    reconciler: &Reconciler,
    pool: &PgPool,
    queue: &Queue,
    kept_since: DateTime<Utc>,
    deadline: Instant,
) -> ReconcileReport {
    let mut run = Run {
        source: &reconciler.source,
        pool,
        queue,
        kept_since,
        deadline,
        report: ReconcileReport {
            source: reconciler.source.clone(),
            ..Default::default()
        },
        to_enqueue: Vec::new(),
    };
    let mut result = match &reconciler.how {
        Reconciliation::Feed(feed) => run.feed(feed.as_ref()).await,
        Reconciliation::Sweep(sweep) => run.sweep(sweep.as_ref()).await,
        Reconciliation::Customers(plans) => run.customers(plans.as_ref()).await,
    };
    // Whatever the outcome, what was stored goes to the queue (or is rescued later).
    if let Err(e) = run.flush().await {
        result = result.and(Err(e));
    }
    let mut report = run.report;
    if let Err(e) = result {
        tracing::error!(error = format!("{e:#}"), "reconciliation failed");
        report.error = Some(format!("{e:#}"));
    }
    if let Err(e) = record(pool, &report).await {
        tracing::error!(error = %e, "could not record the reconciliation run");
    }
    report
}

async fn record(pool: &PgPool, r: &ReconcileReport) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        INSERT INTO reconcile_runs (source, finished_at, cursor_from, cursor_to, read, stored_new,
                                    discrepancies, error, already_present, stopped_early, behind_secs,
                                    failed_reads, skipped)
        VALUES ($1, inbox_now(), $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
        "#,
        r.source,
        r.cursor_from,
        r.cursor_to,
        r.read,
        r.stored_new,
        r.discrepancies,
        r.error,
        r.already_present,
        r.stopped_early,
        r.behind_secs,
        r.failed.len() as i32,
        r.skipped.len() as i32,
    )
    .execute(exec(pool))
    .await?;
    Ok(())
}

impl Run<'_> {
    /// The run stops early for the rate: its source's budget is spent, or the provider asked
    /// for a pause.
    fn throttled(&mut self, error: &anyhow::Error) {
        tracing::info!(
            error = format!("{error:#}"),
            "reconciliation stops for the provider's rate; the next run goes on"
        );
        self.report.stopped_early = true;
    }

    fn time_is_up(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Stores one fetched event through the inbox store (a new one is enqueued) and counts it.
    async fn store(&mut self, fetched: &Fetched) -> anyhow::Result<Verdict> {
        let stored = store_verified(
            self.pool,
            self.source,
            &fetched.body,
            &fetched.event,
            Origin::Fetched,
        )
        .await
        .context("storing a fetched event")?;
        if stored.marked {
            self.to_enqueue.push(stored.event_id);
        }
        self.report.read += 1;
        match stored.verdict {
            Verdict::Stored => {
                self.report.stored_new += 1;
                self.report.discrepancies += 1;
                tracing::warn!(
                    dedupe_key = fetched.event.dedupe_key.as_str(),
                    "event missing from webhooks, fetched"
                );
            }
            Verdict::Duplicate => self.report.already_present += 1,
            Verdict::Conflict => {
                self.report.discrepancies += 1;
                tracing::warn!(
                    dedupe_key = fetched.event.dedupe_key.as_str(),
                    "the provider's copy of a stored event differs from it"
                );
            }
        }
        Ok(stored.verdict)
    }

    /// Sends the new events stored since the last flush, ten to a request.
    async fn flush(&mut self) -> anyhow::Result<()> {
        let ids = std::mem::take(&mut self.to_enqueue);
        if !ids.is_empty() {
            enqueue_or_unmark(self.pool, self.queue, &ids).await?;
        }
        Ok(())
    }

    async fn feed(&mut self, feed: &dyn EventFeed) -> anyhow::Result<()> {
        // What the provider failed to deliver first: it may still be retrying for days. It
        // lists an event for as long as it keeps it (Stripe: 30 days), the retention may be
        // shorter, and an event stored and purged would come back as new: so the list is read
        // only as far back as the purge leaves every stored event in place.
        let mut after: Option<String> = None;
        for _ in 0..MAX_UNDELIVERED_PAGES {
            if self.time_is_up() {
                break;
            }
            let page = match feed.undelivered(self.kept_since, after.as_deref()).await {
                Ok(page) => page,
                // The budget is spent, or the provider asked for a pause: the next run reads
                // the list again, and walks on (docs/design.md §6.7).
                Err(e) if Throttled::find(&e).is_some() => {
                    self.throttled(&e);
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            for fetched in &page.events {
                self.store(fetched).await?;
            }
            self.flush().await?;
            after = page.next;
            if after.is_none() {
                break;
            }
        }
        self.walk(feed).await
    }

    /// The forward walk: window after window from the cursor, each read newest first (the
    /// feed's order), the position saved after every page.
    async fn walk(&mut self, feed: &dyn EventFeed) -> anyhow::Result<()> {
        let now = Utc::now();
        let mut at = Position::load(self.pool, self.source, now).await?;
        self.report.cursor_from = Some(at.cursor);
        let horizon = whole_seconds(now - chrono::Duration::from_std(LAG).unwrap_or_default());
        let window = chrono::Duration::from_std(WINDOW).unwrap_or_default();
        let mut pages = 0;
        let result = loop {
            if at.cursor >= horizon {
                break Ok(());
            }
            if pages == MAX_PAGES || self.time_is_up() {
                self.report.stopped_early = true;
                break Ok(());
            }
            let until = at
                .window_end
                .unwrap_or_else(|| (at.cursor + window).min(horizon));
            let page = match feed
                .page(
                    Window {
                        from: at.cursor,
                        until,
                    },
                    at.after.as_deref(),
                )
                .await
            {
                Ok(page) => page,
                // The budget is spent, or the provider asked for a pause: the next run goes
                // on from here (docs/design.md §6.7).
                Err(e) if Throttled::find(&e).is_some() => {
                    self.throttled(&e);
                    break Ok(());
                }
                Err(e) => break Err(e),
            };
            pages += 1;
            for fetched in &page.events {
                self.store(fetched).await?;
            }
            self.flush().await?;
            at = match page.next {
                Some(next) => Position {
                    window_end: Some(until),
                    after: Some(next),
                    ..at
                },
                None => Position {
                    cursor: until,
                    window_end: None,
                    after: None,
                },
            };
            at.save(self.pool, self.source).await?;
        };
        self.report.cursor_to = Some(at.cursor);
        self.report.behind_secs = Some((now - at.cursor).num_seconds().max(0) as f64);
        result
    }

    async fn sweep(&mut self, sweep: &dyn SubscriptionSweep) -> anyhow::Result<()> {
        for page in 1..=MAX_PAGES {
            if self.time_is_up() {
                break;
            }
            let listed = match sweep.page(page).await {
                Ok(listed) => listed,
                Err(e) if Throttled::find(&e).is_some() => {
                    self.throttled(&e);
                    break;
                }
                Err(e) => return Err(e),
            };
            for subscription in &listed.subscriptions {
                let Some(id) = sweep.subscription_id(subscription) else {
                    continue;
                };
                let local = {
                    let mut conn = self.pool.acquire().await?;
                    stored_subscription(&mut conn, self.source, id).await?
                };
                match sweep.correction(subscription, local.as_ref())? {
                    Some(corrective) => {
                        self.store(&corrective).await?;
                    }
                    None => {
                        self.report.read += 1;
                        self.report.already_present += 1;
                    }
                }
            }
            if listed.last {
                break;
            }
        }
        Ok(())
    }
}

impl Run<'_> {
    /// The customer sweep: the next customers after the saved position, each read and
    /// compared with its plan and entitlement registers; the position is saved after each
    /// customer, read or not, and starts over once the last customer is read.
    ///
    /// A customer whose read fails is passed over, and the failure is counted against it only
    /// when the provider answered another read in the same run: reads that all fail say the
    /// provider is down (the run stops after [`OUTAGE_READS`] of them and fails), not that
    /// these customers cannot be read.
    async fn customers(&mut self, plans: &dyn CustomerPlans) -> anyhow::Result<()> {
        let now = Utc::now();
        let at = Position::load(self.pool, self.source, now).await?;
        let since = now - chrono::Duration::from_std(RECENT).unwrap_or_default();
        let customers =
            recent_customers(self.pool, self.source, since, at.after.as_deref()).await?;
        let complete = customers.len() < MAX_CUSTOMERS as usize;
        let failing = failing_customers(self.pool, self.source, &customers).await?;
        let mut failed: Vec<(&String, anyhow::Error)> = Vec::new();
        let mut answered = false;
        let mut swept = true;
        for customer in &customers {
            if self.time_is_up() {
                self.report.stopped_early = true;
                swept = false;
                break;
            }
            if failing.skipped.contains(customer) {
                self.report.skipped.push(customer.clone());
            } else {
                let local = {
                    let mut conn = self.pool.acquire().await?;
                    StoredCustomer {
                        plan: stored_plan(&mut conn, self.source, customer).await?,
                        entitlements: stored_entitlements(&mut conn, self.source, customer).await?,
                    }
                };
                match plans.corrections(customer, &local, Utc::now()).await {
                    Ok(found) => {
                        answered = true;
                        if failing.recorded.contains(customer) {
                            forget_failures(self.pool, self.source, customer).await?;
                        }
                        if found.is_empty() {
                            self.report.read += 1;
                            self.report.already_present += 1;
                        }
                        for corrective in &found {
                            self.store(corrective).await?;
                        }
                    }
                    // Not read for the rate: not the customer's failure; the next run starts
                    // with it.
                    Err(e) if Throttled::find(&e).is_some() => {
                        self.throttled(&e);
                        swept = false;
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(
                            customer = customer.as_str(),
                            error = format!("{e:#}"),
                            "a customer's read failed; the sweep goes on"
                        );
                        failed.push((customer, e));
                    }
                }
            }
            Position {
                cursor: now,
                window_end: None,
                after: Some(customer.clone()),
            }
            .save(self.pool, self.source)
            .await?;
            if !answered && failed.len() >= OUTAGE_READS {
                swept = false;
                break;
            }
        }
        if swept && complete {
            Position {
                cursor: now,
                window_end: None,
                after: None,
            }
            .save(self.pool, self.source)
            .await?;
        } else if swept {
            self.report.stopped_early = true;
        }
        if !answered {
            return match failed.into_iter().next() {
                Some((_, first)) => Err(first.context(
                    "no customer's read was answered this run (counted against none of them)",
                )),
                None => Ok(()),
            };
        }
        for (customer, e) in failed {
            let error = format!("{e:#}");
            let failures = count_failure(self.pool, self.source, customer, &error).await?;
            self.report.failed.push(FailedRead {
                customer: customer.clone(),
                failures,
                error,
            });
        }
        Ok(())
    }
}

/// The customers among `customers` with failed reads on record, and those of them the sweep
/// skips: failed [`MAX_READ_FAILURES`] runs in a row, the last less than [`SKIPPED_FOR`] ago.
struct Failing {
    recorded: HashSet<String>,
    skipped: HashSet<String>,
}

async fn failing_customers(
    pool: &PgPool,
    source: &str,
    customers: &[String],
) -> Result<Failing, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT customer_key,
               failures >= $3 AND last_failed_at > inbox_now() - make_interval(secs => $4)
                   AS "skipped!"
        FROM reconcile_failures
        WHERE source = $1 AND customer_key = ANY($2)
        "#,
        source,
        customers,
        MAX_READ_FAILURES,
        SKIPPED_FOR.as_secs_f64(),
    )
    .fetch_all(exec(pool))
    .await?;
    let mut failing = Failing {
        recorded: HashSet::new(),
        skipped: HashSet::new(),
    };
    for row in rows {
        if row.skipped {
            failing.skipped.insert(row.customer_key.clone());
        }
        failing.recorded.insert(row.customer_key);
    }
    Ok(failing)
}

/// Counts one more run whose read of `customer` failed; returns the runs in a row.
async fn count_failure(
    pool: &PgPool,
    source: &str,
    customer: &str,
    error: &str,
) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        INSERT INTO reconcile_failures (source, customer_key, failures, last_error)
        VALUES ($1, $2, 1, $3)
        ON CONFLICT (source, customer_key) DO UPDATE
            SET failures = reconcile_failures.failures + 1, last_error = EXCLUDED.last_error,
                last_failed_at = inbox_now()
        RETURNING failures
        "#,
        source,
        customer,
        error,
    )
    .fetch_one(exec(pool))
    .await
}

/// A read of `customer` was answered: its failures are forgotten.
async fn forget_failures(pool: &PgPool, source: &str, customer: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "DELETE FROM reconcile_failures WHERE source = $1 AND customer_key = $2",
        source,
        customer
    )
    .execute(exec(pool))
    .await?;
    Ok(())
}

/// The source's customers with events since `since`, in id order after `after`, at most
/// [`MAX_CUSTOMERS`] (read from the `(source, customer_key, occurred_at)` index).
pub async fn recent_customers(
    pool: &PgPool,
    source: &str,
    since: DateTime<Utc>,
    after: Option<&str>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        SELECT DISTINCT customer_key AS "customer!"
        FROM inbox_events
        WHERE source = $1 AND customer_key > COALESCE($2, '') AND occurred_at >= $3
        ORDER BY 1
        LIMIT $4
        "#,
        source,
        after,
        since,
        MAX_CUSTOMERS,
    )
    .fetch_all(exec(pool))
    .await
}

/// Where the feed walk stands: every event before `cursor` is read; the window up to
/// `window_end` is being read, and `after` is the position in it.
struct Position {
    cursor: DateTime<Utc>,
    window_end: Option<DateTime<Utc>>,
    after: Option<String>,
}

impl Position {
    async fn load(pool: &PgPool, source: &str, now: DateTime<Utc>) -> Result<Self, sqlx::Error> {
        let row = sqlx::query!(
            "SELECT cursor_at, window_end, page_after FROM reconcile_cursors WHERE source = $1",
            source
        )
        .fetch_optional(exec(pool))
        .await?;
        Ok(match row {
            Some(row) => Self {
                cursor: row.cursor_at,
                window_end: row.window_end,
                after: row.page_after,
            },
            None => Self {
                cursor: whole_seconds(
                    now - chrono::Duration::from_std(FIRST_LOOKBACK).unwrap_or_default(),
                ),
                window_end: None,
                after: None,
            },
        })
    }

    async fn save(&self, pool: &PgPool, source: &str) -> Result<(), sqlx::Error> {
        sqlx::query!(
            r#"
            INSERT INTO reconcile_cursors (source, cursor_at, window_end, page_after)
            VALUES ($1, $2, $3, $4)
            ON CONFLICT (source) DO UPDATE
                SET cursor_at = EXCLUDED.cursor_at, window_end = EXCLUDED.window_end,
                    page_after = EXCLUDED.page_after, updated_at = inbox_now()
            "#,
            source,
            self.cursor,
            self.window_end,
            self.after,
        )
        .execute(exec(pool))
        .await?;
        Ok(())
    }
}

/// A time cut to whole seconds: the feed filters by whole seconds.
fn whole_seconds(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::config::parse_sources;

    #[test]
    fn only_sources_with_api_credentials_and_a_provider_api_are_reconciled() {
        let sources = parse_sources(
            r#"[{"name":"stripe_keyed","kind":"stripe","secrets":["s"],"api_key":"sk_test"},
                {"name":"stripe_bare","kind":"stripe","secrets":["s"]},
                {"name":"polar","kind":"standard-webhooks","secrets":["p"],"secret_encoding":"raw","api_key":"k"},
                {"name":"kinde","kind":"kinde","jwks_url":"https://x/.well-known/jwks","api_key":"k","api_client_id":"m2m"},
                {"name":"kinde_bare","kind":"kinde","jwks_url":"https://x/.well-known/jwks"}]"#,
        )
        .unwrap();
        let names: Vec<String> = reconcilers(&sources, &reqwest::Client::new())
            .iter()
            .map(|r| r.source().to_owned())
            .collect();
        assert_eq!(names, ["stripe_keyed", "polar", "kinde"]);
    }
}
