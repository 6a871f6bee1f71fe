//! The fold's I/O (docs/design.md §4.11): an account's kept events and stored registers read
//! in one snapshot, each event decided by its provider and the lot folded by `billing::fold`
//! (`fold_account`); the registers compared with that fold (`audit_account`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};

use crate::apply::subscription_read;
use crate::billing::fold::{fields_of, fold_from, FoldEvent, FoldState, Folded, Via};
use crate::billing::rules::SubscriptionRead;
use crate::billing::{registers, Decision, Effect, Settled};
use crate::domain::{Catalog, CustomerId, Period, SourceKind};
use crate::inbox::kept::{self, KeptEvent, Purged, MAX_FOLDED_EVENTS};
use crate::inbox::thin::StoredEvent;
use crate::platform::config::SourceConfig;
use crate::platform::db::exec;
use crate::providers;

use super::points::{self, Resume};

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
    /// The checked point no longer holds the fold of the events it covers (the events its
    /// registers name that it does not own are not those it folded): fold from nothing.
    #[error("the account's checked point does not cover its events")]
    StalePoint,
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
    /// How far the fold reached, for the audit's checked point.
    pub(super) reach: Reach,
    /// Each event after which the plan differs from before it, in provider order (only when
    /// the reading asks for the plan's timeline).
    pub plan_steps: Vec<PlanStep>,
}

/// An event that changed the account's plan, as the fold gives the plan: the plan before it
/// and after it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanStep {
    pub event: EventRef,
    pub from: String,
    pub to: String,
}

/// How far a fold reached: the point it leaves (`None`: the account has no event), whether
/// it folded anything the point it started from did not hold, and whether it stopped short
/// of the newest events (an account folded in steps).
#[derive(Debug, Clone, Default)]
pub(super) struct Reach {
    pub point: Option<Resume>,
    pub moved: bool,
    pub partial: bool,
}

/// How `fold_with` reads: up to a cut; whether it counts what the purge took; from a checked
/// point; and, for the audit, at most `in_steps_of` events at once (the rest left for the
/// next audit from the point this one leaves) instead of refusing an account with more.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Reading<'a> {
    pub cut: Cut,
    pub with_purged: bool,
    pub from: Option<&'a Resume>,
    pub in_steps_of: Option<i64>,
    /// Whether to say each event that changed the plan (`AccountFold::plan_steps`).
    pub plan_steps: bool,
}

/// The events the registers of an account name (holders, grants, links, refunds, the
/// tombstone). Every register's holder is named, whatever the event that holds it (a thin
/// event or a summary whose read it applied under its own id, which the account may not
/// own): a register whose holder is not among the events read is one the audit cannot speak
/// for, and is not compared.
fn named_by(registers: &crate::billing::rules::Registers, ledger: &LedgerByPeriod) -> Vec<i64> {
    let mut ids: BTreeSet<i64> = BTreeSet::new();
    ids.extend(registers.customer_plan.as_ref().map(|h| h.event_id));
    ids.extend(registers.standing.as_ref().map(|h| h.event_id));
    ids.extend(registers.subscriptions.values().map(|h| h.event_id));
    ids.extend(registers.payments.values().map(|h| h.event_id));
    ids.extend(registers.entitlements.values().map(|h| h.event_id));
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

fn via_of(event: &KeptEvent) -> Via {
    Via::of(event.dedupe_key.as_str(), event.via.as_deref())
}

/// Reads and folds the account's kept events; `stored` is the account's registers as read
/// in the same snapshot (they name events the account does not own). From a checked point,
/// only the events after its cut are read and folded, onto its state (docs/design.md §4.11).
pub(super) async fn fold_with(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    (source, customer): (&str, &CustomerId),
    stored: Option<&Stored>,
    reading: Reading<'_>,
) -> Result<AccountFold, FoldError> {
    let Reading {
        cut,
        with_purged,
        from,
        in_steps_of,
        plan_steps,
    } = reading;
    let config = *sources
        .get(source)
        .ok_or_else(|| FoldError::UnknownSource(source.to_owned()))?;
    let named = stored.map(|(r, l)| named_by(r, l)).unwrap_or_default();
    let cap = in_steps_of.unwrap_or(MAX_FOLDED_EVENTS);
    let after = from.map(|p| p.cut);
    // The named events the point covers come too (to say they are kept), beside the cap.
    let limit = cap + 1 + named.len() as i64;
    let rows = kept::account_events(conn, source, customer, &named, (after, limit)).await?;
    // Past the cap, the audit folds the events before the first one left out (a whole
    // provider time: a read sorts at its event's) and keeps a point there.
    let mut before = None;
    let new: Vec<DateTime<Utc>> = rows
        .iter()
        .map(|r| r.occurred_at.as_datetime())
        .filter(|at| after.is_none_or(|t| *at > t))
        .collect();
    if new.len() as i64 > cap {
        let next = new[cap as usize];
        if in_steps_of.is_none() || new[0] >= next {
            return Err(FoldError::TooLarge);
        }
        before = Some(next);
    }
    let owned = |row: &KeptEvent| row.customer.as_ref() == Some(customer);
    // The events the registers name that the account does not own are folded wherever they
    // sort: those at or before the point must be the ones it folded.
    let mut foreign: BTreeSet<i64> = BTreeSet::new();
    if let Some(point) = from {
        let covered: BTreeSet<i64> = rows
            .iter()
            .filter(|r| !owned(r) && r.occurred_at.as_datetime() <= point.cut)
            .map(|r| r.id)
            .collect();
        if covered != point.foreign_ids.iter().copied().collect() {
            return Err(FoldError::StalePoint);
        }
        foreign = covered;
    }
    let kept_ids = rows.iter().map(|r| r.id).collect();
    let by_key: HashMap<&str, &KeptEvent> =
        rows.iter().map(|r| (r.dedupe_key.as_str(), r)).collect();
    let provider = providers::provider(config.kind);
    let mut events = Vec::with_capacity(rows.len());
    let mut refs = BTreeMap::new();
    let mut reached = after;
    for row in &rows {
        let at = row.occurred_at.as_datetime();
        if after.is_some_and(|t| at <= t) || before.is_some_and(|t| at >= t) {
            continue;
        }
        reached = reached.max(Some(at));
        if !owned(row) {
            foreign.insert(row.id);
        }
        let Some(payload) = &row.payload else {
            continue;
        };
        // A thin event carries nothing: its read is the event (docs/design.md §6.2).
        if provider.notice(payload).is_some() {
            continue;
        }
        let beyond = cut.at.is_some_and(|t| at > t)
            || cut.received_before.is_some_and(|t| row.received_at >= t);
        if beyond {
            continue;
        }
        let decision = providers::decide(config.kind, &row.event_type, payload, catalog);
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
    let start = from.map(|p| p.state.clone()).unwrap_or_default();
    let plan_steps = match plan_steps {
        true => steps_of_plan(start.clone(), (source, customer), &events, &refs, catalog),
        false => Vec::new(),
    };
    let folded = fold_from(start, source, customer, &events, catalog);
    let moved = reached != after;
    let reach = Reach {
        point: reached.map(|cut| Resume {
            cut,
            state: folded.state_at_cut(),
            foreign_ids: foreign.into_iter().collect(),
            events: from.map_or(0, |p| p.events) + events.len() as i64,
        }),
        moved: moved || from.is_none(),
        partial: before.is_some(),
    };
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
        reach,
        plan_steps,
    })
}

/// The plan through `events`: each folded onto what those before it left (the fold of a set is
/// the fold of its first part, then of the rest from there), the plan compared before and
/// after it.
fn steps_of_plan(
    mut state: FoldState,
    (source, customer): (&str, &CustomerId),
    events: &[FoldEvent],
    refs: &BTreeMap<i64, EventRef>,
    catalog: &Catalog,
) -> Vec<PlanStep> {
    let mut order: Vec<&FoldEvent> = events.iter().collect();
    order.sort_by(|a, b| {
        let at = |e: &FoldEvent| e.at.as_datetime().timestamp_micros();
        (at(a), a.key.as_str(), a.id).cmp(&(at(b), b.key.as_str(), b.id))
    });
    let plan_of = |folded: &Folded, event: &FoldEvent| {
        folded.state(customer, &Period::of(event.at), catalog).plan
    };
    let mut steps = Vec::new();
    let mut before = None;
    for event in order {
        let from = match before.take() {
            Some(plan) => plan,
            None => plan_of(
                &fold_from(state.clone(), source, customer, &[], catalog),
                event,
            ),
        };
        let after = fold_from(
            state,
            source,
            customer,
            std::slice::from_ref(event),
            catalog,
        );
        let to = plan_of(&after, event);
        if from != to {
            if let Some(event) = refs.get(&event.id) {
                steps.push(PlanStep {
                    event: event.clone(),
                    from,
                    to: to.clone(),
                });
            }
        }
        before = Some(to);
        state = after.state_at_cut();
    }
    steps
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
    let reading = Reading {
        cut,
        with_purged: true,
        ..Reading::default()
    };
    let folded = fold_with(&mut tx, sources, catalog, account, stored.as_ref(), reading).await?;
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
pub(super) async fn snapshot(
    conn: &mut PgConnection,
) -> Result<sqlx::Transaction<'_, sqlx::Postgres>, sqlx::Error> {
    conn.begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
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
pub(super) fn compare(
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

/// Each period's `used` as stored, and the sum of its accepted debits not reversed of the
/// allowance's unit (a debit of another unit spends grants only, docs/design.md §4.14).
pub(super) async fn used_by_period(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
) -> Result<BTreeMap<String, (i64, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT p.period, p.used,
               COALESCE((SELECT sum(d.amount) FROM usage_debits d
                         WHERE d.source = p.source AND d.customer_id = p.customer_id
                           AND d.period = p.period AND d.accepted
                           AND d.reversed_at IS NULL AND d.unit = $3), 0)::bigint AS "debited!"
        FROM usage_periods p WHERE p.source = $1 AND p.customer_id = $2
        ORDER BY p.period
        "#,
        source,
        customer.as_str(),
        crate::billing::credits::ALLOWANCE_UNIT,
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
/// with the fold of its kept events, in one snapshot: from its checked point when it has one,
/// and when it is found clean, the point moves to its newest event (docs/design.md §4.11).
pub async fn audit_account(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    account: (&str, &CustomerId),
) -> Result<Audited, FoldError> {
    audit_account_in_steps_of(conn, sources, catalog, account, MAX_FOLDED_EVENTS).await
}

/// [`audit_account`], folding at most `cap` events at once: an account with more since its
/// point is folded `cap` events further each audit, and compared once the fold reaches its
/// newest event.
pub async fn audit_account_in_steps_of(
    conn: &mut PgConnection,
    sources: &Sources,
    catalog: &Catalog,
    (source, customer): (&str, &CustomerId),
    cap: i64,
) -> Result<Audited, FoldError> {
    let config = sources
        .get(source)
        .ok_or_else(|| FoldError::UnknownSource(source.to_owned()))?;
    let fingerprint = points::fingerprint(config.kind, config.livemode, catalog);
    points::claim(conn, source, customer).await?;
    let mut tx = snapshot(conn).await?;
    let stored = registers::of_account(&mut tx, source, customer).await?;
    let Some(stored) = stored else {
        tx.commit().await?;
        return Ok(Audited::Checked(Vec::new()));
    };
    let point = points::read(&mut tx, (source, customer), &fingerprint).await?;
    let from = point.as_ref().and_then(|p| p.resume.as_ref());
    let reading = |from| Reading {
        from,
        in_steps_of: Some(cap),
        ..Reading::default()
    };
    let account = (source, customer);
    let folded = match fold_with(
        &mut tx,
        sources,
        catalog,
        account,
        Some(&stored),
        reading(from),
    )
    .await
    {
        Err(FoldError::StalePoint) => {
            fold_with(
                &mut tx,
                sources,
                catalog,
                account,
                Some(&stored),
                reading(None),
            )
            .await
        }
        other => other,
    };
    let folded = match folded {
        Err(FoldError::TooLarge) => return Ok(Audited::Skipped("too many events")),
        other => other?,
    };
    if !folded.pending.is_empty() {
        tx.commit().await?;
        return Ok(Audited::Skipped("events in flight"));
    }
    let used = used_by_period(&mut tx, source, customer).await?;
    tx.commit().await?;
    let moves = point.as_ref().map_or(0, |p| p.moves);
    let reached = folded.reach.point.as_ref().filter(|_| folded.reach.moved);
    if folded.reach.partial {
        // Not compared yet: the registers hold events past the point.
        keep(conn, account, moves, reached, &fingerprint).await;
        return Ok(Audited::Skipped(
            "too many events: folded up to a point, the next audit goes on",
        ));
    }
    let found = compare(&stored, &folded, &used, account);
    if found.is_empty() {
        keep(conn, account, moves, reached, &fingerprint).await;
    }
    Ok(Audited::Checked(found))
}

/// Keeps the point the audit reached; one not kept (an event changed meanwhile, or the write
/// failed) leaves the next audit to fold from the point before.
async fn keep(
    conn: &mut PgConnection,
    (source, customer): (&str, &CustomerId),
    moves: i64,
    reached: Option<&Resume>,
    fingerprint: &str,
) {
    let Some(reached) = reached else {
        return;
    };
    if let Err(e) = points::keep(conn, (source, customer), moves, reached, fingerprint).await {
        tracing::warn!(source, error = %e, "an account's checked point was not kept");
    }
}
