//! The fold put to work (docs/design.md §4.11): an account's kept events read and decided,
//! folded by `billing::fold`, and then explained field by field (`why`, `--at`,
//! `--received-before`) or compared with the registers as stored (the audit: on demand, and
//! a bounded sample each scheduler run).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection, PgPool};

use crate::apply::subscription_read;
use crate::billing::fold::{fields_of, fold, Beaten, FoldEvent, Folded, Via};
use crate::billing::rules::SubscriptionRead;
use crate::billing::{registers, Decision, Effect, Settled};
use crate::domain::{Catalog, CustomerId, SourceKind};
use crate::inbox::kept::{self, KeptEvent, Purged, MAX_FOLDED_EVENTS};
use crate::inbox::thin::StoredEvent;
use crate::platform::config::SourceConfig;
use crate::platform::db::exec;
use crate::providers;

/// What the fold knows of a configured source.
#[derive(Debug, Clone, Copy)]
pub struct AuditSource {
    pub kind: SourceKind,
    pub livemode: Option<bool>,
}

impl From<&SourceConfig> for AuditSource {
    fn from(config: &SourceConfig) -> Self {
        Self {
            kind: config.kind,
            livemode: config.livemode,
        }
    }
}

impl From<&crate::apply::WorkerSource> for AuditSource {
    fn from(source: &crate::apply::WorkerSource) -> Self {
        Self {
            kind: source.kind,
            livemode: source.livemode,
        }
    }
}

/// The configured sources by name.
pub type Sources = HashMap<String, AuditSource>;

pub fn sources_of(configs: &[SourceConfig]) -> Sources {
    configs
        .iter()
        .map(|c| (c.name.clone(), AuditSource::from(c)))
        .collect()
}

/// Which of the kept events to fold: those the provider created up to `at`, those received
/// before `received_before` (what the store knew then).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cut {
    pub at: Option<DateTime<Utc>>,
    pub received_before: Option<DateTime<Utc>>,
}

/// An event as `why` names it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRef {
    pub event_id: i64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub occurred_at: DateTime<Utc>,
    pub via: Via,
    pub replayed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum FoldError {
    #[error("source '{0}' is not configured")]
    UnknownSource(String),
    #[error("the account has more than {MAX_FOLDED_EVENTS} events; it is not folded")]
    TooLarge,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// An account's kept events, folded.
pub struct AccountFold {
    pub folded: Folded,
    pub events: BTreeMap<i64, EventRef>,
    pub purged: Purged,
    /// The account's events not finished yet.
    pub pending: Vec<i64>,
    /// The ids of events the store still has among those the registers name.
    pub kept_ids: BTreeSet<i64>,
}

/// The events the registers of an account name (holders, grants, links, refunds, the
/// tombstone).
fn named_by(registers: &crate::billing::rules::Registers, ledger: &LedgerByPeriod) -> Vec<i64> {
    let mut ids: BTreeSet<i64> = BTreeSet::new();
    ids.extend(registers.customer_plan.as_ref().map(|h| h.event_id));
    ids.extend(registers.standing.as_ref().map(|h| h.event_id));
    ids.extend(registers.subscriptions.values().map(|h| h.event_id));
    ids.extend(registers.payments.values().map(|h| h.event_id));
    for intent in registers.intents.values() {
        ids.extend(intent.linked_by);
        ids.extend(intent.refunded_by);
    }
    ids.extend(registers.account.deleted_by);
    ids.extend(ledger.values().flatten().map(|e| e.event_id));
    ids.into_iter().collect()
}

type LedgerByPeriod = BTreeMap<String, Vec<crate::billing::rules::LedgerEntry>>;
type Stored = (crate::billing::rules::Registers, LedgerByPeriod);

/// How the event reached the store: by its key (a worker's read, a reconciliation's
/// correction) or what its first delivery row says.
fn via_of(event: &KeptEvent) -> Via {
    let key = event.dedupe_key.as_str();
    if key.starts_with("read:") {
        return Via::Fetch;
    }
    if key.starts_with("reconcile:") {
        return Via::Correction;
    }
    match event.via.as_deref() {
        Some("reconciliation") => Via::Reconciliation,
        Some("eventbridge") => Via::EventBridge,
        Some(_) => Via::Fetch,
        None => Via::Webhook,
    }
}

/// Reads and folds the account's kept events; `stored` is the account's registers as read
/// in the same snapshot (they name events the account does not own). `with_purged`: also
/// count what the purge took of the account's log.
async fn fold_with(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    (source, customer): (&str, &CustomerId),
    stored: Option<&Stored>,
    (cut, with_purged): (Cut, bool),
) -> Result<AccountFold, FoldError> {
    let config = *sources
        .get(source)
        .ok_or_else(|| FoldError::UnknownSource(source.to_owned()))?;
    let named = stored.map(|(r, l)| named_by(r, l)).unwrap_or_default();
    let rows = kept::account_events(conn, source, customer, &named).await?;
    if rows.len() as i64 > MAX_FOLDED_EVENTS {
        return Err(FoldError::TooLarge);
    }
    let kept_ids = rows.iter().map(|r| r.id).collect();
    let by_key: HashMap<&str, &KeptEvent> =
        rows.iter().map(|r| (r.dedupe_key.as_str(), r)).collect();
    let provider = providers::provider(config.kind);
    let mut events = Vec::with_capacity(rows.len());
    let mut refs = BTreeMap::new();
    for row in &rows {
        let Some(payload) = &row.payload else {
            continue;
        };
        // A thin event carries nothing: its read is the event (docs/design.md §6.2).
        if provider.notice(payload).is_some() {
            continue;
        }
        let at = row.occurred_at.as_datetime();
        let beyond = cut.at.is_some_and(|t| at > t)
            || cut.received_before.is_some_and(|t| row.received_at >= t);
        if beyond {
            continue;
        }
        let decision = providers::decide(
            config.kind,
            &row.event_type,
            payload,
            &row.dedupe_key,
            catalog,
        );
        let excluded = provider.out_of_scope(payload, config.livemode);
        let settled: Settled = row
            .settled
            .clone()
            .and_then(|s| serde_json::from_value(s).ok())
            .unwrap_or_default();
        let shown = shown_read(config.kind, row, &decision, &by_key, catalog, cut);
        refs.insert(
            row.id,
            EventRef {
                event_id: row.id,
                event_type: row.event_type.clone(),
                occurred_at: at,
                via: via_of(row),
                replayed: row.replays > 0,
            },
        );
        events.push(FoldEvent {
            id: row.id,
            key: row.dedupe_key.clone(),
            event_type: row.event_type.clone(),
            at: row.occurred_at,
            decision,
            excluded,
            settled,
            shown,
        });
    }
    let folded = fold(source, customer, &events, catalog);
    Ok(AccountFold {
        folded,
        events: refs,
        // What the purge took says how far back an answer is whole; the audit, which compares
        // only what is kept, does not ask.
        purged: match with_purged {
            true => kept::purged(conn, source, customer).await?,
            false => Purged::default(),
        },
        pending: kept::pending(conn, source, customer).await?,
        kept_ids,
    })
}

/// The account's kept events folded, as of the cut, read in one snapshot with the registers
/// that name events it does not own.
pub async fn fold_account(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    account: (&str, &CustomerId),
    cut: Cut,
) -> Result<AccountFold, FoldError> {
    let mut tx = snapshot(conn).await?;
    let stored = registers::of_account(&mut tx, account.0, account.1).await?;
    let folded = fold_with(
        &mut tx,
        sources,
        catalog,
        account,
        stored.as_ref(),
        (cut, true),
    )
    .await?;
    tx.commit().await?;
    Ok(folded)
}

/// The stored read of an invoice's subscription made for `row`, as the worker found it
/// (docs/design.md §6.2): the first subscription the invoice names whose read is kept.
fn shown_read(
    kind: SourceKind,
    row: &KeptEvent,
    decision: &Decision,
    by_key: &HashMap<&str, &KeptEvent>,
    catalog: &Catalog,
    cut: Cut,
) -> SubscriptionRead {
    let Decision::Apply { effects, .. } = decision else {
        return SubscriptionRead::NotRead;
    };
    for effect in effects {
        let Effect::GrantOfSubscription { subscriptions, .. } = effect else {
            continue;
        };
        let Some(id) = subscriptions.first() else {
            continue;
        };
        let Some(key) = subscription_read::read_key(&row.dedupe_key, id) else {
            continue;
        };
        let Some(read) = by_key.get(key.as_str()) else {
            continue;
        };
        if cut.received_before.is_some_and(|t| read.received_at >= t) {
            continue;
        }
        let stored = StoredEvent {
            id: read.id,
            dedupe_key: read.dedupe_key.clone(),
            event_type: read.event_type.clone(),
            payload: read.payload.clone(),
            customer: read.customer.clone(),
            occurred_at: Some(read.occurred_at),
            status: String::new(),
        };
        return subscription_read::shown(kind, id, &stored, catalog);
    }
    SubscriptionRead::NotRead
}

/// Opens the snapshot the audit and `why` read in: every statement sees the same committed
/// state, so no event commits between the registers' read and the events'.
async fn snapshot(
    conn: &mut PgConnection,
) -> Result<sqlx::Transaction<'_, sqlx::Postgres>, sqlx::Error> {
    conn.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
}

/// One field of `why`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhyField {
    pub field: String,
    pub value: Value,
    pub decided_by: Option<EventRef>,
    pub beaten: Vec<Beaten>,
    /// What the register holds now, when it is not what the fold gives (a register moved by
    /// something other than its events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored: Option<Value>,
}

/// `inboxctl why` and `GET …/why`: every field of the account as its kept events give it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Why {
    pub source: String,
    pub customer_id: String,
    /// The cut, when one was asked for.
    pub at: Option<DateTime<Utc>>,
    pub received_before: Option<DateTime<Utc>>,
    pub fields: Vec<WhyField>,
    /// Events the purge took: the answer is whole only for times at or after `complete_from`.
    pub purged: i64,
    pub complete_from: Option<DateTime<Utc>>,
    /// Events of the account not finished yet: the registers do not show them yet.
    pub pending: Vec<i64>,
    /// Fields whose register differs from the fold (empty for a cut in the past, which is
    /// not compared).
    pub divergent: Vec<String>,
}

/// Explains the account, as of the cut. `None` when the account does not exist and has no
/// kept event.
pub async fn why(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    (source, customer): (&str, &CustomerId),
    cut: Cut,
) -> Result<Option<Why>, FoldError> {
    let mut tx = snapshot(conn).await?;
    let stored = registers::of_account(&mut tx, source, customer).await?;
    let account = fold_with(
        &mut tx,
        sources,
        catalog,
        (source, customer),
        stored.as_ref(),
        (cut, true),
    )
    .await?;
    let used = used_by_period(&mut tx, source, customer).await?;
    tx.commit().await?;
    if stored.is_none() && account.events.is_empty() {
        return Ok(None);
    }
    let whole = cut.at.is_none() && cut.received_before.is_none();
    let differences: BTreeMap<String, Value> = match (&stored, whole) {
        (Some(stored), true) => compare(stored, &account, &used, (source, customer))
            .into_iter()
            .map(|d| (d.field, d.stored))
            .collect(),
        _ => BTreeMap::new(),
    };
    let mut fields: Vec<WhyField> = account
        .folded
        .explain(customer, catalog)
        .into_iter()
        .map(|e| WhyField {
            stored: differences.get(&e.field).cloned(),
            decided_by: e.decided_by.and_then(|id| account.events.get(&id).cloned()),
            field: e.field,
            value: e.value,
            beaten: e.beaten,
        })
        .collect();
    if whole {
        // A period's `used` is the sum of its accepted debits, as the audit compares it.
        for (period, (_, debited)) in &used {
            let field = format!("used:{period}");
            fields.push(WhyField {
                stored: differences.get(&field).cloned(),
                field,
                value: json!(debited),
                decided_by: None,
                beaten: Vec::new(),
            });
        }
    }
    // A register the fold does not give at all (written by hand, or by a purged event).
    for (field, value) in &differences {
        if !fields.iter().any(|f| &f.field == field) {
            fields.push(WhyField {
                field: field.clone(),
                value: Value::Null,
                decided_by: None,
                beaten: Vec::new(),
                stored: Some(value.clone()),
            });
        }
    }
    let divergent: Vec<String> = differences.into_keys().collect();
    Ok(Some(Why {
        source: source.to_owned(),
        customer_id: customer.as_str().to_owned(),
        at: cut.at,
        received_before: cut.received_before,
        fields,
        purged: account.purged.count,
        complete_from: account.purged.latest,
        pending: account.pending,
        divergent,
    }))
}

/// A field whose register is not what the fold gives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Divergence {
    pub source: String,
    pub customer_id: String,
    pub field: String,
    pub stored: Value,
    pub folded: Value,
}

/// The fields where the registers differ from the fold, among those the fold can speak for
/// (a register whose holder the purge took, stored before the purge kept holders, is left
/// out, and so is a period whose grants it took), and the periods whose `used` is not the
/// sum of their accepted debits.
fn compare(
    stored: &Stored,
    account: &AccountFold,
    used: &BTreeMap<String, (i64, i64)>,
    (source, customer): (&str, &CustomerId),
) -> Vec<Divergence> {
    let (registers, ledger) = stored;
    let here = fields_of(registers, ledger);
    let there = account.folded.fields();
    let kept = |by: &Option<i64>| by.is_none_or(|id| account.kept_ids.contains(&id));
    let whole_period = |field: &str| {
        let Some(period) = field.strip_prefix("allowance:") else {
            return true;
        };
        ledger.get(period).is_none_or(|entries| {
            entries
                .iter()
                .all(|e| account.kept_ids.contains(&e.event_id))
        })
    };
    let mut out = Vec::new();
    let names: BTreeSet<&String> = here.keys().chain(there.keys()).collect();
    for field in names {
        let stored = here.get(field);
        let folded = there.get(field);
        if stored.is_some_and(|(_, by)| !kept(by)) || !whole_period(field) {
            continue;
        }
        let value =
            |v: Option<&(Value, Option<i64>)>| v.map(|v| v.0.clone()).unwrap_or(Value::Null);
        if value(stored) != value(folded) {
            out.push(Divergence {
                source: source.to_owned(),
                customer_id: customer.as_str().to_owned(),
                field: field.clone(),
                stored: value(stored),
                folded: value(folded),
            });
        }
    }
    for (period, (used, debited)) in used {
        if used != debited {
            out.push(Divergence {
                source: source.to_owned(),
                customer_id: customer.as_str().to_owned(),
                field: format!("used:{period}"),
                stored: json!(used),
                folded: json!(debited),
            });
        }
    }
    out
}

/// Each period's `used` as stored, and the sum of its accepted debits.
async fn used_by_period(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
) -> Result<BTreeMap<String, (i64, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT p.period, p.used,
               COALESCE((SELECT sum(d.amount) FROM usage_debits d
                         WHERE d.source = p.source AND d.customer_id = p.customer_id
                           AND d.period = p.period AND d.accepted), 0)::bigint AS "debited!"
        FROM usage_periods p WHERE p.source = $1 AND p.customer_id = $2
        ORDER BY p.period
        "#,
        source,
        customer.as_str(),
    )
    .fetch_all(exec(conn))
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.period, (r.used, r.debited)))
        .collect())
}

/// What the audit of one account found.
#[derive(Debug, Clone, PartialEq)]
pub enum Audited {
    /// Compared: the fields that differ (empty: none).
    Checked(Vec<Divergence>),
    /// Not compared now: events in flight, or too many to fold.
    Skipped(&'static str),
}

/// Compares one account's registers (and each period's `used` with its accepted debits)
/// with the fold of its kept events, in one snapshot.
pub async fn audit_account(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    (source, customer): (&str, &CustomerId),
) -> Result<Audited, FoldError> {
    let mut tx = snapshot(conn).await?;
    let stored = registers::of_account(&mut tx, source, customer).await?;
    let Some(stored) = stored else {
        tx.commit().await?;
        return Ok(Audited::Checked(Vec::new()));
    };
    let account = match fold_with(
        &mut tx,
        sources,
        catalog,
        (source, customer),
        Some(&stored),
        (Cut::default(), false),
    )
    .await
    {
        Err(FoldError::TooLarge) => return Ok(Audited::Skipped("too many events")),
        other => other?,
    };
    if !account.pending.is_empty() {
        tx.commit().await?;
        return Ok(Audited::Skipped("events in flight"));
    }
    let used = used_by_period(&mut tx, source, customer).await?;
    tx.commit().await?;
    Ok(Audited::Checked(compare(
        &stored,
        &account,
        &used,
        (source, customer),
    )))
}

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
