//! Reconciliation with the providers' APIs: what the webhooks never delivered is fetched and
//! stored through the same path as a delivery, so it is deduplicated and ordered like one.
//!
//! - Stripe: `GET /v1/events` since a stored cursor (with an overlap), paginated with
//!   `starting_after`. A missing event is stored and applied; a present one is only counted.
//! - Polar: `GET /v1/subscriptions/` (current state, `modified_at` as its time). A
//!   subscription whose state differs from the local register and is newer than it becomes a
//!   corrective `subscription.updated` event with the provider's time: it goes through the
//!   same ordering guard and can never overwrite newer state.
//! - Kinde: its Management API exposes billing entitlements per customer, but not a change
//!   feed; Kinde sources are not reconciled yet, and are skipped.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::config::{SourceConfig, SourceKind};
use crate::intake::store_verified;
use crate::providers::{standard, stripe};
use crate::queue::Queue;
use crate::store::Verdict;

/// How far before the cursor each Stripe read starts: events can become visible late.
pub const OVERLAP: Duration = Duration::from_secs(15 * 60);
/// Where the first read starts.
pub const FIRST_LOOKBACK: Duration = Duration::from_secs(3 * 86_400);
const MAX_PAGES: usize = 20;
const PAGE_SIZE: usize = 100;

pub enum Reconciler {
    Stripe { source: String, api: Api },
    Polar { source: String, api: Api },
}

pub struct Api {
    pub base_url: String,
    pub key: String,
    pub http: reqwest::Client,
}

impl Reconciler {
    pub fn source(&self) -> &str {
        match self {
            Self::Stripe { source, .. } | Self::Polar { source, .. } => source,
        }
    }
}

/// One reconciler per source that has an API key; sources without one are skipped.
pub fn reconcilers(
    sources: &[SourceConfig],
    http: &reqwest::Client,
) -> Result<Vec<Reconciler>, String> {
    let mut out = Vec::new();
    for source in sources {
        let Some(key) = source.api_key.clone() else {
            continue;
        };
        let api = |default: &str| Api {
            base_url: source
                .api_base_url
                .clone()
                .unwrap_or_else(|| default.to_owned())
                .trim_end_matches('/')
                .to_owned(),
            key: key.clone(),
            http: http.clone(),
        };
        match source.kind {
            SourceKind::Stripe => out.push(Reconciler::Stripe {
                source: source.name.clone(),
                api: api("https://api.stripe.com"),
            }),
            SourceKind::StandardWebhooks => out.push(Reconciler::Polar {
                source: source.name.clone(),
                api: api("https://api.polar.sh"),
            }),
            SourceKind::Kinde => {
                tracing::info!(source = %source.name, "Kinde sources are not reconciled; api_key ignored");
            }
        }
    }
    Ok(out)
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

/// Runs one source's reconciliation and records it; an API error fails this source only.
#[tracing::instrument(skip_all, fields(source = reconciler.source()))]
pub async fn run(
    reconciler: &Reconciler,
    pool: &PgPool,
    queue: &Queue,
    deadline: Instant,
) -> ReconcileReport {
    let mut report = ReconcileReport {
        source: reconciler.source().to_owned(),
        ..Default::default()
    };
    let result = match reconciler {
        Reconciler::Stripe { source, api } => {
            stripe_events(source, api, pool, queue, deadline, &mut report).await
        }
        Reconciler::Polar { source, api } => {
            polar_subscriptions(source, api, pool, queue, deadline, &mut report).await
        }
    };
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

async fn get_json(api: &Api, path: &str, query: &[(&str, String)]) -> anyhow::Result<Value> {
    let response = api
        .http
        .get(format!("{}{path}", api.base_url))
        .bearer_auth(&api.key)
        .query(query)
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("GET {path} answered {status}");
    }
    response
        .json()
        .await
        .with_context(|| format!("reading GET {path} as JSON"))
}

/// Stores one fetched event as a delivery would be stored; a new one is enqueued.
async fn store_fetched(
    pool: &PgPool,
    queue: &Queue,
    source: &str,
    body: &[u8],
    verified: &crate::providers::VerifiedEvent,
) -> anyhow::Result<Verdict> {
    let headers = json!({"via": "reconciliation"});
    let stored = store_verified(pool, source, body, verified, &headers)
        .await
        .map_err(|e| anyhow::anyhow!("storing a fetched event: {e}"))?;
    if stored.verdict == Verdict::Stored && stored.status.is_pending() {
        if let Err(e) = queue.send_event(stored.event_id).await {
            // Stored and unmarked: the rescue step of the next run sends it.
            tracing::warn!(
                event_id = stored.event_id,
                error = format!("{e:#}"),
                "enqueue failed"
            );
            let mut conn = pool.acquire().await?;
            crate::store::unmark_enqueued(&mut conn, stored.event_id).await?;
        }
    }
    Ok(stored.verdict)
}

async fn stripe_events(
    source: &str,
    api: &Api,
    pool: &PgPool,
    queue: &Queue,
    deadline: Instant,
    report: &mut ReconcileReport,
) -> anyhow::Result<()> {
    let cursor = sqlx::query_scalar!(
        "SELECT cursor_at FROM reconcile_cursors WHERE source = $1",
        source
    )
    .fetch_optional(pool)
    .await?
    .unwrap_or_else(|| Utc::now() - chrono::Duration::from_std(FIRST_LOOKBACK).unwrap_or_default());
    let from = cursor - chrono::Duration::from_std(OVERLAP).unwrap_or_default();
    report.cursor_from = Some(from);
    let mut newest = cursor;
    let mut starting_after: Option<String> = None;
    let mut complete = false;
    for _ in 0..MAX_PAGES {
        if Instant::now() >= deadline {
            break;
        }
        let mut query = vec![
            ("limit", PAGE_SIZE.to_string()),
            ("created[gte]", from.timestamp().to_string()),
        ];
        if let Some(after) = &starting_after {
            query.push(("starting_after", after.clone()));
        }
        let page = get_json(api, "/v1/events", &query).await?;
        let events = page
            .get("data")
            .and_then(Value::as_array)
            .context("the events list has no data")?;
        for event in events {
            let body = serde_json::to_vec(event)?;
            let verified = stripe::parse_event(&body, Utc::now());
            if let Ok(meta) = &verified.meta {
                newest = newest.max(meta.occurred_at.as_datetime());
            }
            report.read += 1;
            match store_fetched(pool, queue, source, &body, &verified).await? {
                Verdict::Stored => {
                    report.stored_new += 1;
                    report.discrepancies += 1;
                    tracing::warn!(
                        dedupe_key = verified.dedupe_key.as_str(),
                        "event missing from webhooks, fetched"
                    );
                }
                Verdict::Duplicate => {}
                Verdict::Conflict => report.discrepancies += 1,
            }
        }
        starting_after = events
            .last()
            .and_then(|e| e.get("id"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if page.get("has_more").and_then(Value::as_bool) != Some(true) || starting_after.is_none() {
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
            source,
            newest,
        )
        .execute(pool)
        .await?;
        report.cursor_to = Some(newest);
    }
    Ok(())
}

async fn polar_subscriptions(
    source: &str,
    api: &Api,
    pool: &PgPool,
    queue: &Queue,
    deadline: Instant,
    report: &mut ReconcileReport,
) -> anyhow::Result<()> {
    for page in 1..=MAX_PAGES {
        if Instant::now() >= deadline {
            break;
        }
        let query = [
            ("page", page.to_string()),
            ("limit", PAGE_SIZE.to_string()),
            ("sorting", "-modified_at".to_owned()),
        ];
        let body = get_json(api, "/v1/subscriptions/", &query).await?;
        let items = body
            .get("items")
            .and_then(Value::as_array)
            .context("the subscriptions list has no items")?;
        for subscription in items {
            report.read += 1;
            if let Some(corrective) = polar_correction(pool, source, subscription).await? {
                let (id, body) = corrective;
                let verified = standard::parse_event(&id, &body, Utc::now());
                if store_fetched(pool, queue, source, &body, &verified).await? == Verdict::Stored {
                    report.stored_new += 1;
                    report.discrepancies += 1;
                }
            }
        }
        let max_page = body
            .pointer("/pagination/max_page")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        if items.is_empty() || page as u64 >= max_page {
            break;
        }
    }
    Ok(())
}

/// The corrective event for a subscription the provider shows in another state than the local
/// register, when the provider's state is newer; `None` when they agree or ours is newer.
async fn polar_correction(
    pool: &PgPool,
    source: &str,
    subscription: &Value,
) -> anyhow::Result<Option<(String, Vec<u8>)>> {
    let text = |p: &str| subscription.pointer(p).and_then(Value::as_str);
    let (Some(id), Some(status)) = (text("/id"), text("/status")) else {
        return Ok(None);
    };
    let Some(time) = text("/modified_at").or(text("/created_at")) else {
        return Ok(None);
    };
    let remote_at = DateTime::parse_from_rfc3339(time)
        .context("subscription modified_at")?
        .with_timezone(&Utc);
    let local = sqlx::query!(
        "SELECT status, plan_key, version_at FROM subscriptions WHERE source = $1 AND subscription_id = $2",
        source,
        id
    )
    .fetch_optional(pool)
    .await?;
    let remote_plan = text("/product_id");
    let differs = match &local {
        None => true,
        Some(l) => {
            remote_at > l.version_at
                && (l.status != status
                    || (remote_plan.is_some() && l.plan_key.as_deref() != remote_plan))
        }
    };
    if !differs {
        return Ok(None);
    }
    let dedupe = format!("reconcile:{id}:{}", remote_at.timestamp_millis());
    let body = serde_json::to_vec(&json!({
        "type": "subscription.updated",
        "timestamp": time,
        "data": subscription,
    }))?;
    Ok(Some((dedupe, body)))
}
