//! An account's state read in one statement (the snapshot an app reads, the one derivation
//! of plan, allowance, used and remaining: docs/design.md §4.10), and the account as
//! operators and tests read it: the snapshot, the registers behind it and the event log that
//! explains them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::model::{status_entitles, AccountState, StateInputs};
use crate::domain::features::{self, FeatureValue, Features};
use crate::domain::{Catalog, CustomerId, Period};
use crate::platform::db::exec;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionView {
    pub id: String,
    pub status: String,
    pub plan: Option<String>,
    /// Its ends (docs/design.md §4.4), as the winning event's object says.
    pub current_period_end: Option<DateTime<Utc>>,
    pub cancel_at_period_end: bool,
    pub cancel_at: Option<DateTime<Utc>>,
    pub trial_end: Option<DateTime<Utc>>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// An account's state for one period, as an app reads it (the API's answer to
/// `GET /v1/accounts/{source}/{customer}`, docs/api.md): derived by [`AccountState::derive`]
/// from one statement's read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccountSnapshot {
    pub source: String,
    /// As stored: a Stripe Connect customer is `acct_…/cus_…`.
    pub customer_id: String,
    /// The catalog's plan name, `"free"` when nothing entitles the customer.
    pub plan: String,
    /// `plan` is not the free plan.
    pub entitled: bool,
    pub deleted: bool,
    /// `YYYY-MM`.
    pub period: String,
    /// The period's largest grant; 0 for a deleted customer.
    pub allowance: i64,
    /// The sum of the period's accepted debits.
    pub used: i64,
    /// `max(allowance − used, 0)`.
    pub remaining: i64,
    pub subscriptions: Vec<SubscriptionView>,
    /// What the customer may use (docs/design.md §4.12): the catalog's features of `plan`
    /// joined with the provider's active entitlements.
    pub features: Features,
    /// Where each feature's value comes from and the event behind it. The feature check's
    /// answer; not part of the account's JSON.
    #[serde(skip)]
    pub feature_origins: std::collections::BTreeMap<String, FeatureOrigin>,
    /// Counts the writes that can move the account's state: every event written about it
    /// (`accounts.version`) plus every accepted debit (of any period). It only grows; two
    /// snapshots with the same version and period are the same.
    pub version: i64,
    /// The plan register (Kinde plan events): its plan, if any. Operators' view only.
    #[serde(skip)]
    pub customer_plan: Option<String>,
    /// The payment standing register (Kinde). Operators' view only.
    #[serde(skip)]
    pub past_due: bool,
    /// Prepaid credit per unit and scope, as of the store's clock (docs/design.md §4.14). The
    /// account read's `credits`; not part of the effects' `account` block.
    #[serde(skip)]
    pub credits: Vec<super::credits::BalanceView>,
}

/// A stored event as a feature's origin names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRef {
    pub event_id: i64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub occurred_at: Option<DateTime<Utc>>,
}

/// Where a feature's value comes from: the catalog (through the plan, `decided_by` the
/// register that gives the plan) or a provider's entitlement (`decided_by` the event its
/// register holds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FeatureOrigin {
    pub source: &'static str,
    pub decided_by: Option<EventRef>,
}

/// A register as the snapshot reads it for features: what it gives (a plan, or an
/// entitlement's features) and the event it holds, at its version.
#[derive(Debug, Clone, Deserialize)]
struct Giver {
    plan: Option<String>,
    #[serde(default)]
    active: bool,
    #[serde(default)]
    features: Features,
    at: DateTime<Utc>,
    #[serde(default)]
    rank: i64,
    version_key: String,
    #[serde(flatten)]
    event: EventRef,
}

impl Giver {
    fn stamp(&self) -> (DateTime<Utc>, i64, &str) {
        (self.at, self.rank, self.version_key.as_str())
    }
}

/// Each feature's origin: the catalog when the plan's features give the account's value (a
/// tie goes to the catalog), else the active entitlement that gives it (of several, the one
/// at the earliest version, so the answer does not depend on arrival order). The plan's
/// register is the latest entitling one that gives the derived plan.
fn origins(
    features: &Features,
    plan: &str,
    plan_givers: &[Giver],
    entitlements: &[Giver],
    catalog: &Catalog,
) -> std::collections::BTreeMap<String, FeatureOrigin> {
    let of_plan = catalog.features_of(plan);
    let plan_event = plan_givers
        .iter()
        .filter(|g| g.plan.as_deref() == Some(plan))
        .max_by(|a, b| a.stamp().cmp(&b.stamp()))
        .map(|g| g.event.clone());
    features
        .iter()
        .map(|(key, value)| {
            let origin = if of_plan.get(key) == Some(value) {
                FeatureOrigin {
                    source: "catalog",
                    decided_by: plan_event.clone(),
                }
            } else {
                let giver = entitlements
                    .iter()
                    .filter(|g| g.active && g.features.get(key) == Some(value))
                    .min_by(|a, b| a.stamp().cmp(&b.stamp()));
                FeatureOrigin {
                    source: "provider",
                    decided_by: giver.map(|g| g.event.clone()),
                }
            };
            (key.clone(), origin)
        })
        .collect()
}

impl AccountSnapshot {
    /// A feature as the app checks it: `(allowed, value, origin)`; a feature the account lacks
    /// is not allowed, with no value and no origin.
    pub fn feature(&self, key: &str) -> (bool, Option<&FeatureValue>, Option<&FeatureOrigin>) {
        let value = self.features.get(key);
        (
            value.is_some_and(FeatureValue::allows),
            value,
            self.feature_origins.get(key),
        )
    }

    /// The account as an effect tells it; `period` is the one the snapshot was read for.
    pub fn state(&self, period: &Period) -> AccountState {
        AccountState {
            plan: self.plan.clone(),
            features: self.features.clone(),
            balance: self.allowance,
            used: self.used,
            remaining: self.remaining,
            period: period.clone(),
        }
    }
}

/// Reads an account's state for `period` in one statement (one round trip); `None` when the
/// source has no such customer.
#[tracing::instrument(skip_all, fields(source, period = period.as_str()))]
pub async fn snapshot(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    catalog: &Catalog,
) -> Result<Option<AccountSnapshot>, sqlx::Error> {
    let Some(row) = sqlx::query!(
        r#"
        SELECT a.deleted_at IS NOT NULL AS "deleted!",
               (a.version + COALESCE((SELECT sum(accepted + reversed) FROM usage_periods
                                      WHERE source = $1 AND customer_id = $2), 0))::bigint AS "version!",
               (SELECT plan FROM customer_plans WHERE source = $1 AND customer_id = $2) AS customer_plan,
               COALESCE((SELECT past_due FROM customer_standing
                         WHERE source = $1 AND customer_id = $2), false) AS "past_due!",
               (SELECT COALESCE(sum(delta), 0) FROM ledger
                WHERE source = $1 AND customer_id = $2 AND period = $3)::bigint AS "granted!",
               COALESCE((SELECT used FROM usage_periods
                         WHERE source = $1 AND customer_id = $2 AND period = $3), 0) AS "used!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'id', subscription_id, 'status', status, 'plan', plan,
                           'current_period_end', current_period_end,
                           'cancel_at_period_end', cancel_at_period_end, 'cancel_at', cancel_at,
                           'trial_end', trial_end, 'ended_at', ended_at)
                           ORDER BY subscription_id), '[]')
                FROM subscriptions WHERE source = $1 AND customer_id = $2) AS "subscriptions!",
               -- The registers that give the plan (for the features' origin) and the
               -- entitlements, each with the event it holds.
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'plan', g.plan, 'at', g.version_at, 'rank', g.version_rank,
                           'version_key', g.version_key, 'event_id', g.event_id,
                           'type', e.type, 'occurred_at', e.occurred_at)), '[]')
                FROM (SELECT plan, version_at, version_rank, version_key, event_id
                      FROM customer_plans WHERE source = $1 AND customer_id = $2
                      UNION ALL
                      SELECT plan, version_at, version_rank, version_key, event_id
                      FROM subscriptions
                      WHERE source = $1 AND customer_id = $2 AND status IN ('active', 'trialing')
                     ) AS g
                LEFT JOIN inbox_events e ON e.id = g.event_id) AS "plan_givers!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'active', r.active, 'features', r.features, 'at', r.version_at,
                           'rank', r.version_rank, 'version_key', r.version_key,
                           'event_id', r.event_id, 'type', e.type,
                           'occurred_at', e.occurred_at)), '[]')
                FROM entitlements r LEFT JOIN inbox_events e ON e.id = r.event_id
                WHERE r.source = $1 AND r.customer_id = $2) AS "entitlements!",
               -- The credits read's rows (billing::credits_read, inbox_account_credits),
               -- folded as of the store's clock: the account's balances in the same one
               -- statement.
               inbox_secs(inbox_now()) AS "credits_at!",
               inbox_account_credits($1, $2) AS "credits!"
        FROM accounts a WHERE a.source = $1 AND a.customer_id = $2
        "#,
        source,
        customer.as_str(),
        period.as_str(),
    )
    .fetch_optional(exec(conn))
    .await?
    else {
        return Ok(None);
    };
    let subscriptions: Vec<SubscriptionView> = serde_json::from_value(row.subscriptions)
        .map_err(|e| sqlx::Error::Decode(format!("subscriptions: {e}").into()))?;
    let decode = |what: &str, value| -> Result<Vec<Giver>, sqlx::Error> {
        serde_json::from_value(value)
            .map_err(|e| sqlx::Error::Decode(format!("{what}: {e}").into()))
    };
    let plan_givers = decode("plan registers", row.plan_givers)?;
    let entitlements = decode("entitlements", row.entitlements)?;
    let mut entitled = Features::new();
    for giver in entitlements.iter().filter(|g| g.active) {
        features::join(&mut entitled, &giver.features);
    }
    let inputs = StateInputs {
        deleted: row.deleted,
        customer_plan: row.customer_plan.as_deref(),
        past_due: row.past_due,
        granted: row.granted,
        used: row.used,
        entitlements: &entitled,
    };
    let entitling = subscriptions
        .iter()
        .filter(|s| status_entitles(&s.status))
        .filter_map(|s| s.plan.as_deref());
    let state = AccountState::derive(inputs, entitling, period, catalog);
    let credits = super::credits_read::CreditRows::decode(row.credits)?
        .as_of(row.credits_at)
        .view()
        .balances;
    let feature_origins = origins(
        &state.features,
        &state.plan,
        &plan_givers,
        &entitlements,
        catalog,
    );
    Ok(Some(AccountSnapshot {
        source: source.to_owned(),
        customer_id: customer.as_str().to_owned(),
        entitled: state.plan != super::FREE,
        plan: state.plan,
        deleted: row.deleted,
        period: period.to_string(),
        allowance: state.balance,
        used: state.used,
        remaining: state.remaining,
        subscriptions,
        features: state.features,
        feature_origins,
        version: row.version,
        customer_plan: row.customer_plan,
        past_due: row.past_due,
        credits,
    }))
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaymentView {
    pub id: String,
    pub status: String,
}

/// One event of the account's log: the events `GET …/events` lists, in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogLine {
    pub event_id: i64,
    #[serde(rename = "type")]
    pub event_type: String,
    pub occurred_at: Option<DateTime<Utc>>,
    /// `applied`, `ignored` or `unprocessable` once the event is finished; else its status
    /// (`received`, `processing`, `failed`, `dead`).
    pub outcome: String,
    pub reason: String,
}

/// Why a register that could give the account a plan does not count toward it (or counts
/// for less): a reason of `why`'s `plan` field, in the same words (`billing::fold`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanReason {
    pub reason: String,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccountView {
    pub source: String,
    pub customer_id: String,
    pub plan: String,
    pub deleted: bool,
    /// The plan register (Kinde plan events): the catalog's plan for its key, if any.
    pub customer_plan: Option<String>,
    /// The plan register's key as the provider named it, known to the catalog or not.
    pub customer_plan_key: Option<String>,
    pub past_due: bool,
    /// The payment standing register (Kinde): `past_due`, `good`, or none.
    pub standing: Option<String>,
    /// What the registers hold that does not make the plan: the same derivation as `why`'s
    /// `plan` field gives, over the stored registers.
    pub plan_reasons: Vec<PlanReason>,
    pub period: String,
    /// The period's allowance (the snapshot's `allowance`).
    pub balance: i64,
    pub used: i64,
    pub remaining: i64,
    pub subscriptions: Vec<SubscriptionView>,
    /// The account's features, and where each comes from (the snapshot's).
    pub features: Features,
    pub feature_origins: std::collections::BTreeMap<String, FeatureOrigin>,
    pub payments: Vec<PaymentView>,
    /// The log in provider order, the newest last: all of it, or its latest lines when the
    /// reader asked for fewer.
    pub log: Vec<LogLine>,
    /// How many lines the whole log has.
    pub log_total: i64,
}

/// Reads an account with its whole log; `None` when the source has no such customer.
pub async fn load(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    catalog: &Catalog,
) -> Result<Option<AccountView>, sqlx::Error> {
    load_with_log(conn, source, customer, period, catalog, None).await
}

/// Like [`load`], with only the latest `log_lines` lines of the log when given. An account
/// with thousands of events a day keeps a log of millions of lines (it outlives the
/// purge), and the reader wants the latest; the index on `(source, customer_id,
/// occurred_at)` gives them without reading the rest.
pub async fn load_with_log(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    catalog: &Catalog,
    log_lines: Option<i64>,
) -> Result<Option<AccountView>, sqlx::Error> {
    let Some(snapshot) = snapshot(conn, source, customer, period, catalog).await? else {
        return Ok(None);
    };
    let (customer_plan_key, standing, plan_reasons) =
        match super::registers::of_account(&mut *conn, source, customer).await? {
            Some((registers, ledger)) => explained(registers, ledger, customer, catalog),
            None => (None, None, Vec::new()),
        };
    let customer = customer.as_str();
    // A refunded charge whose invoice is not known yet shows as its own refunded payment
    // until the link arrives and the invoice takes the refund.
    let payments: Vec<PaymentView> = sqlx::query_as!(
        PaymentView,
        r#"SELECT payment_id AS "id!", status AS "status!" FROM payments
           WHERE source = $1 AND customer_id = $2
           UNION ALL
           SELECT refunded_charge, 'refunded' FROM payment_intents
           WHERE source = $1 AND customer_id = $2 AND invoice_id IS NULL
             AND refunded_charge IS NOT NULL
           ORDER BY 1"#,
        source,
        customer
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    // The account's log as the app's route lists it (the view `account_events`, one list for
    // both): a line per finished event, and the events not finished or given up, whose
    // outcome is their status (their row read only for them). LIMIT NULL is no limit.
    let log: Vec<LogLine> = sqlx::query_as!(
        LogLine,
        r#"SELECT l.event_id AS "event_id!", l.event_type AS "event_type!", l.occurred_at,
                  COALESCE(l.outcome,
                           (SELECT e.status FROM inbox_events e WHERE e.id = l.event_id))
                    AS "outcome!",
                  COALESCE(l.reason, '') AS "reason!"
           FROM (SELECT event_id, event_type, occurred_at, outcome, reason
                 FROM account_events
                 WHERE source = $1 AND customer_id = $2
                 ORDER BY occurred_at DESC, event_id DESC LIMIT $3) l
           ORDER BY l.occurred_at, l.event_id"#,
        source,
        customer,
        log_lines
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    let log_total = match log_lines {
        Some(lines) if log.len() as i64 >= lines => sqlx::query_scalar!(
            r#"SELECT count(*) AS "count!" FROM account_events WHERE source = $1 AND customer_id = $2"#,
            source,
            customer
        )
        .fetch_one(exec(&mut *conn))
        .await?,
        _ => log.len() as i64,
    };
    Ok(Some(AccountView {
        source: snapshot.source,
        customer_id: snapshot.customer_id,
        plan: snapshot.plan,
        deleted: snapshot.deleted,
        customer_plan: snapshot.customer_plan,
        customer_plan_key,
        past_due: snapshot.past_due,
        standing,
        plan_reasons,
        period: snapshot.period,
        balance: snapshot.allowance,
        used: snapshot.used,
        remaining: snapshot.remaining,
        subscriptions: snapshot.subscriptions,
        features: snapshot.features,
        feature_origins: snapshot.feature_origins,
        payments,
        log,
        log_total,
    }))
}

/// The plan register's key, the standing and the reasons of the plan, from the stored
/// registers explained as `why` explains the fold's (one derivation: `Folded::explain`). The
/// events are `why`'s to name; here the reasons are the registers'.
fn explained(
    registers: super::rules::Registers,
    ledger: std::collections::BTreeMap<String, Vec<super::rules::LedgerEntry>>,
    customer: &CustomerId,
    catalog: &Catalog,
) -> (Option<String>, Option<String>, Vec<PlanReason>) {
    let key = registers
        .customer_plan
        .as_ref()
        .and_then(|held| held.value.key.clone());
    let standing = registers.standing.as_ref().map(|held| {
        match held.value {
            true => "past_due",
            false => "good",
        }
        .to_owned()
    });
    let stored = super::fold::Folded {
        registers,
        ledger,
        ..Default::default()
    };
    let reasons = stored
        .explain(customer, catalog)
        .into_iter()
        .find(|field| field.field == "plan")
        .map(|plan| plan.beaten)
        .unwrap_or_default()
        .into_iter()
        .map(|beaten| PlanReason {
            reason: beaten.reason.to_owned(),
            detail: beaten.detail,
        })
        .collect();
    (key, standing, reasons)
}

/// Reads [`AccountState`] in one statement, as it stands (the worker derives it from its
/// read instead: `rules::Registers::state`; this is what checks that against the database).
/// An account that does not exist is on the free plan with nothing.
pub async fn state(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    catalog: &Catalog,
) -> Result<AccountState, sqlx::Error> {
    Ok(
        match snapshot(conn, source, customer, period, catalog).await? {
            Some(snapshot) => snapshot.state(period),
            None => AccountState {
                plan: super::FREE.to_owned(),
                features: super::model::account_features(
                    false,
                    super::FREE,
                    &Features::new(),
                    catalog,
                ),
                balance: 0,
                used: 0,
                remaining: 0,
                period: period.clone(),
            },
        },
    )
}

/// A period's balance: the allowance granted in it (the largest, by construction of `delta`).
pub async fn period_balance(
    conn: &mut PgConnection,
    source: &str,
    customer: &str,
    period: &str,
) -> Result<i64, sqlx::Error> {
    let balance = sqlx::query_scalar!(
        r#"SELECT COALESCE(sum(delta), 0)::bigint AS "balance!" FROM ledger
           WHERE source = $1 AND customer_id = $2 AND period = $3"#,
        source,
        customer,
        period
    )
    .fetch_one(exec(conn))
    .await?;
    Ok(balance)
}

/// Whether the source has the customer.
pub async fn exists(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM accounts WHERE source = $1 AND customer_id = $2) AS "exists!""#,
        source,
        customer.as_str()
    )
    .fetch_one(exec(conn))
    .await
}

/// The sources in which a customer has an account.
pub async fn account_sources(
    conn: &mut PgConnection,
    customer: &CustomerId,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT source FROM accounts WHERE customer_id = $1 ORDER BY source",
        customer.as_str()
    )
    .fetch_all(exec(conn))
    .await
}
