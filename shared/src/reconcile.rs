//! Reconciliation with the providers' APIs (docs/design.md §6): what the webhooks never
//! delivered is fetched and stored through the inbox's own store, so it is deduplicated and
//! ordered like a delivery, then enqueued. Each provider says how it is read (its folder's
//! `api`); this module runs it, keeps the feed cursor and records each run.
//!
//! - An event feed (Stripe): every event since the stored cursor (with an overlap), page by
//!   page. A missing event is stored and applied; a present one is only counted. The cursor
//!   moves only past a complete read.
//! - A subscription sweep (Polar): the provider's current subscriptions; one the local
//!   register shows in an older, different state becomes a corrective event.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::billing::registers::stored_subscription;
use crate::config::SourceConfig;
use crate::domain::Verdict;
use crate::inbox::enqueue_or_unmark;
use crate::inbox::store::{fetched_headers, store_verified};
use crate::providers::{provider, Api, EventFeed, Fetched, Reconciliation, SubscriptionSweep};
use crate::queue::Queue;

/// How far before the cursor each feed read starts: events can become visible late.
pub const OVERLAP: Duration = Duration::from_secs(15 * 60);
/// Where the first read starts.
pub const FIRST_LOOKBACK: Duration = Duration::from_secs(3 * 86_400);
const MAX_PAGES: u32 = 20;

/// One source's reconciliation.
pub struct Reconciler {
    source: String,
    how: Reconciliation,
}

impl Reconciler {
    /// The source's reconciliation, when it has an API key and its provider can be
    /// reconciled.
    pub fn for_source(config: &SourceConfig, http: &reqwest::Client) -> Option<Self> {
        let how =
            Api::for_source(config, http).and_then(|api| provider(config.kind).reconciliation(api));
        if how.is_none() && config.api_key.is_some() {
            tracing::info!(source = %config.name, kind = config.kind.as_str(),
                "this kind of source is not reconciled; api_key ignored");
        }
        Some(Self {
            source: config.name.clone(),
            how: how?,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }
}

/// One reconciler per source that can be reconciled; the other sources are skipped.
pub fn reconcilers(sources: &[SourceConfig], http: &reqwest::Client) -> Vec<Reconciler> {
    sources
        .iter()
        .filter_map(|source| Reconciler::for_source(source, http))
        .collect()
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ReconcileReport {
    pub source: String,
    pub cursor_from: Option<DateTime<Utc>>,
    pub cursor_to: Option<DateTime<Utc>>,
    pub read: i32,
    pub stored_new: i32,
    pub discrepancies: i32,
    pub error: Option<String>,
}

/// Where fetched events go: the inbox store and the queue, within the run's time.
struct Run<'a> {
    source: &'a str,
    pool: &'a PgPool,
    queue: &'a Queue,
    deadline: Instant,
    report: ReconcileReport,
}

/// Runs one source's reconciliation and records it; an API error fails this source only.
#[tracing::instrument(skip_all, fields(source = reconciler.source()))]
pub async fn run(
    reconciler: &Reconciler,
    pool: &PgPool,
    queue: &Queue,
    deadline: Instant,
) -> ReconcileReport {
    let mut run = Run {
        source: &reconciler.source,
        pool,
        queue,
        deadline,
        report: ReconcileReport {
            source: reconciler.source.clone(),
            ..Default::default()
        },
    };
    let result = match &reconciler.how {
        Reconciliation::Feed(feed) => run.feed(feed.as_ref()).await,
        Reconciliation::Sweep(sweep) => run.sweep(sweep.as_ref()).await,
    };
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
        INSERT INTO reconcile_runs (source, finished_at, cursor_from, cursor_to, read, stored_new, discrepancies, error)
        VALUES ($1, now(), $2, $3, $4, $5, $6, $7)
        "#,
        r.source,
        r.cursor_from,
        r.cursor_to,
        r.read,
        r.stored_new,
        r.discrepancies,
        r.error,
    )
    .execute(pool)
    .await?;
    Ok(())
}

impl Run<'_> {
    fn time_is_up(&self) -> bool {
        Instant::now() >= self.deadline
    }

    /// Stores one fetched event as a delivery would be stored; a new one is enqueued.
    async fn store(&mut self, fetched: &Fetched) -> anyhow::Result<Verdict> {
        let stored = store_verified(
            self.pool,
            self.source,
            &fetched.body,
            &fetched.event,
            &fetched_headers(),
        )
        .await
        .context("storing a fetched event")?;
        if stored.verdict == Verdict::Stored && stored.status.is_pending() {
            enqueue_or_unmark(self.pool, self.queue, &[stored.event_id]).await?;
        }
        Ok(stored.verdict)
    }

    async fn feed(&mut self, feed: &dyn EventFeed) -> anyhow::Result<()> {
        let cursor = sqlx::query_scalar!(
            "SELECT cursor_at FROM reconcile_cursors WHERE source = $1",
            self.source
        )
        .fetch_optional(self.pool)
        .await?
        .unwrap_or_else(|| {
            Utc::now() - chrono::Duration::from_std(FIRST_LOOKBACK).unwrap_or_default()
        });
        let from = cursor - chrono::Duration::from_std(OVERLAP).unwrap_or_default();
        self.report.cursor_from = Some(from);
        let mut newest = cursor;
        let mut after: Option<String> = None;
        let mut complete = false;
        for _ in 0..MAX_PAGES {
            if self.time_is_up() {
                break;
            }
            let page = feed.page(from, after.as_deref()).await?;
            for fetched in &page.events {
                if let Ok(meta) = &fetched.event.meta {
                    newest = newest.max(meta.occurred_at.as_datetime());
                }
                self.report.read += 1;
                match self.store(fetched).await? {
                    Verdict::Stored => {
                        self.report.stored_new += 1;
                        self.report.discrepancies += 1;
                        tracing::warn!(
                            dedupe_key = fetched.event.dedupe_key.as_str(),
                            "event missing from webhooks, fetched"
                        );
                    }
                    Verdict::Duplicate => {}
                    Verdict::Conflict => self.report.discrepancies += 1,
                }
            }
            after = page.next;
            if after.is_none() {
                complete = true;
                break;
            }
        }
        // The cursor moves only past a complete read: an interrupted one starts again from it.
        if complete {
            sqlx::query!(
                r#"
                INSERT INTO reconcile_cursors (source, cursor_at) VALUES ($1, $2)
                ON CONFLICT (source) DO UPDATE SET cursor_at = GREATEST(reconcile_cursors.cursor_at, EXCLUDED.cursor_at), updated_at = now()
                "#,
                self.source,
                newest,
            )
            .execute(self.pool)
            .await?;
            self.report.cursor_to = Some(newest);
        }
        Ok(())
    }

    async fn sweep(&mut self, sweep: &dyn SubscriptionSweep) -> anyhow::Result<()> {
        for page in 1..=MAX_PAGES {
            if self.time_is_up() {
                break;
            }
            let listed = sweep.page(page).await?;
            for subscription in &listed.subscriptions {
                self.report.read += 1;
                let Some(id) = sweep.subscription_id(subscription) else {
                    continue;
                };
                let local = {
                    let mut conn = self.pool.acquire().await?;
                    stored_subscription(&mut conn, self.source, id).await?
                };
                if let Some(corrective) = sweep.correction(subscription, local.as_ref())? {
                    if self.store(&corrective).await? == Verdict::Stored {
                        self.report.stored_new += 1;
                        self.report.discrepancies += 1;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_sources;

    #[test]
    fn only_sources_with_an_api_key_and_a_provider_api_are_reconciled() {
        let sources = parse_sources(
            r#"[{"name":"stripe_keyed","kind":"stripe","secrets":["s"],"api_key":"sk_test"},
                {"name":"stripe_bare","kind":"stripe","secrets":["s"]},
                {"name":"polar","kind":"standard-webhooks","secrets":["p"],"secret_encoding":"raw","api_key":"k"},
                {"name":"kinde","kind":"kinde","jwks_url":"https://x/.well-known/jwks","api_key":"k"}]"#,
        )
        .unwrap();
        let names: Vec<String> = reconcilers(&sources, &reqwest::Client::new())
            .iter()
            .map(|r| r.source().to_owned())
            .collect();
        assert_eq!(names, ["stripe_keyed", "polar"]);
    }
}
