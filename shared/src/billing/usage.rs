//! Usage: the app spends a period's allowance, then its credit grants (docs/design.md §4.10,
//! §4.14). A debit is a stored fact keyed by the account and the app's idempotency key, decided
//! and stored with its answer in one call of `inbox_debit`
//! (migrations/20261231200001_debits_burn_credits.sql) under the lock of the account's period
//! and, when it needs grants, of the account and unit, so concurrent debits never spend past
//! the allowance and the grants and a key asked again answers the same. `remaining =
//! allowance − used`, the allowance being the period's largest grant. What each debit took
//! from the grants is derived ([`allocations`]), never stored as truth.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgConnection;

use super::account;
use super::credits::{self, Quantity, ALLOWANCE_UNIT, BURN_ORDER_VERSION};
use super::model::period_totals;
use crate::domain::effect::{effect_id, Kind};
use crate::domain::meter::{correction_identifier, identifier, report_id};
use crate::domain::{Catalog, CustomerId, Period};
use crate::platform::db::exec;

/// The largest single debit: far above any real allowance, far below what sums overflow at.
pub const MAX_AMOUNT: i64 = 1_000_000_000;
/// The longest idempotency key (Stripe's limit).
pub const MAX_KEY_LEN: usize = 255;
/// The longest note kept with a debit, in characters.
pub const MAX_NOTE_CHARS: usize = 500;
/// The longest unit a debit names (a currency, a custom pricing unit's id, `credits`).
pub const MAX_UNIT_LEN: usize = 100;

/// The month a debit spends: the one its request named, or, when it named none, the month it
/// arrived in. The two are kept apart in the stored request, so that a request naming no
/// month, sent again after the month turned (its first answer lost at 23:59:59), is the same
/// request and gets the first one's answer, in the first one's month.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DebitPeriod {
    /// `"period": "2026-11"` in the API's body, `--period 2026-11` in `inboxctl usage record`.
    Named(Period),
    /// No period asked for: the UTC month the request arrived in.
    Arrival(Period),
}

impl DebitPeriod {
    /// The month this request would spend, if its key is new.
    pub fn period(&self) -> &Period {
        match self {
            Self::Named(period) | Self::Arrival(period) => period,
        }
    }

    fn named(&self) -> bool {
        matches!(self, Self::Named(_))
    }
}

/// Why a debit is refused before anything is looked up or stored. One check
/// ([`DebitRequest::checked`]) for both ways in, the API and `inboxctl usage record`, so
/// neither can store as a permanent answer under its key what the other refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("an idempotency key is 1 to {MAX_KEY_LEN} visible ASCII characters")]
    Key,
    #[error("the amount is a whole number from 1 to {MAX_AMOUNT}")]
    Amount,
    #[error("'{0}' is not a YYYY-MM month")]
    Period(String),
    #[error("{period} has not begun (it is {today})")]
    FuturePeriod { period: Period, today: Period },
    #[error(
        "a note is at most {MAX_NOTE_CHARS} characters, with no control characters but tab and newline"
    )]
    Note,
    #[error("a unit is 1 to {MAX_UNIT_LEN} ASCII letters, digits, '_' or '-' ('credits', 'usd', a custom pricing unit's id)")]
    Unit,
}

impl Invalid {
    /// The API's code for it (docs/api.md), also `inboxctl --json`'s.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Key => "bad_idempotency_key",
            Self::Amount => "bad_amount",
            Self::Period(_) => "bad_period",
            Self::FuturePeriod { .. } => "future_period",
            Self::Note => "bad_note",
            Self::Unit => "bad_unit",
        }
    }
}

/// A month a request names: a real one, not after `today`'s.
pub fn asked_period(raw: &str, today: &Period) -> Result<Period, Invalid> {
    let period = Period::parse(raw).map_err(|_| Invalid::Period(raw.to_owned()))?;
    if period > *today {
        return Err(Invalid::FuturePeriod {
            period,
            today: today.clone(),
        });
    }
    Ok(period)
}

/// An idempotency key: 1 to [`MAX_KEY_LEN`] visible ASCII characters.
pub fn check_key(key: &str) -> Result<(), Invalid> {
    let visible = key.bytes().all(|b| b.is_ascii_graphic());
    match !key.is_empty() && key.len() <= MAX_KEY_LEN && visible {
        true => Ok(()),
        false => Err(Invalid::Key),
    }
}

/// A unit a debit names: what grants are kept in (a currency such as `usd`, a custom pricing
/// unit's id, or [`ALLOWANCE_UNIT`]), 1 to [`MAX_UNIT_LEN`] ASCII letters, digits, `_` or `-`.
pub fn check_unit(unit: &str) -> Result<(), Invalid> {
    let kept = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    match !unit.is_empty() && unit.len() <= MAX_UNIT_LEN && unit.bytes().all(kept) {
        true => Ok(()),
        false => Err(Invalid::Unit),
    }
}

/// One debit as the app asks for it.
#[derive(Debug, Clone)]
pub struct DebitRequest<'a> {
    pub source: &'a str,
    pub customer: &'a CustomerId,
    /// The app's idempotency key: 1–255 visible ASCII characters.
    pub key: &'a str,
    /// From 1 to [`MAX_AMOUNT`].
    pub amount: i64,
    pub period: DebitPeriod,
    pub note: Option<&'a str>,
    /// What it spends ([`ALLOWANCE_UNIT`] unless the request names another): a debit of the
    /// allowance's unit spends the period's allowance first, then the grants of its unit in
    /// the burn order (docs/design.md §4.14); one of another unit spends only grants.
    pub unit: &'a str,
    /// `Some(catalog)` when effects are configured (`INBOX_EFFECTS`): the period's
    /// `billing.allowance_exhausted` is written with the debit that exhausts it, its
    /// `account` block naming the plan the catalog derives. Then a debit costs two round
    /// trips (the account's snapshot, then the debit), else one.
    pub effects: Option<&'a Catalog>,
    /// `Some(meter)` when the source reports its debits to a provider's meter (its name
    /// there, docs/design.md §4.13): an accepted debit writes its report in the same call.
    pub meter: Option<&'a str>,
}

/// What an accepted debit took, as it was answered (docs/design.md §4.14): the allowance
/// first, then grants in the burn order `order_version`. The answer is kept under the key; the
/// allocation the account's state holds is derived ([`credits::allocations`]) and moves when a
/// grant told later comes before these in the burn order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocated {
    pub from_allowance: i64,
    pub from_grants: Vec<GrantTaken>,
    pub order_version: u32,
}

/// One grant a debit spent, and how much (a decimal string, as the credits read gives amounts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantTaken {
    pub grant_id: String,
    pub amount: String,
}

/// What remained when a debit was refused: of the allowance, and of each grant of its unit that
/// had any, in the burn order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remains {
    pub remaining_allowance: i64,
    pub grants: Vec<GrantRemaining>,
    pub order_version: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantRemaining {
    pub grant_id: String,
    pub remaining: String,
}

/// What a debit got. A key asked again gets the same answer, but `replayed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Debit {
    Accepted {
        usage_id: String,
        amount: i64,
        period: Period,
        /// The period's used and remaining right after this debit.
        used: i64,
        remaining: i64,
        replayed: bool,
        /// `None` for a debit stored before debits burned grants (all of it the allowance's).
        allocation: Option<Allocated>,
    },
    /// Refused for lack of allowance and grants; stable under its key (a later grant does not
    /// turn it into an acceptance: the app sends a new key).
    Exhausted {
        remaining: i64,
        replayed: bool,
        /// `None` for a refusal stored before debits burned grants.
        remains: Option<Remains>,
    },
    /// The key was used with another amount, period or note.
    KeyConflict,
    CustomerDeleted,
    UnknownCustomer,
}

impl<'a> DebitRequest<'a> {
    /// A debit as the API or `inboxctl usage record` was asked for it, checked by the one
    /// rule both answer by: the key, an amount from 1 to [`MAX_AMOUNT`], a month (`None`: the
    /// one of `today`, the request's arrival) that is not after `today`'s, a note of at most
    /// [`MAX_NOTE_CHARS`] characters without control characters (Postgres cannot store a
    /// NUL; an escape sequence would reach the operator's terminal through `inboxctl usage`).
    /// Effects off; the caller sets [`DebitRequest::effects`].
    #[allow(clippy::too_many_arguments)]
    pub fn checked(
        source: &'a str,
        customer: &'a CustomerId,
        key: &'a str,
        amount: i64,
        period: Option<&str>,
        note: Option<&'a str>,
        unit: Option<&'a str>,
        today: &Period,
    ) -> Result<Self, Invalid> {
        check_key(key)?;
        let unit = unit.unwrap_or(ALLOWANCE_UNIT);
        check_unit(unit)?;
        if !(1..=MAX_AMOUNT).contains(&amount) {
            return Err(Invalid::Amount);
        }
        let period = match period {
            Some(raw) => DebitPeriod::Named(asked_period(raw, today)?),
            None => DebitPeriod::Arrival(today.clone()),
        };
        if let Some(note) = note {
            let kept = |c: char| !c.is_control() || c == '\t' || c == '\n';
            if note.chars().count() > MAX_NOTE_CHARS || !note.chars().all(kept) {
                return Err(Invalid::Note);
            }
        }
        Ok(Self {
            source,
            customer,
            key,
            amount,
            period,
            note,
            unit,
            effects: None,
            meter: None,
        })
    }
}

impl Debit {
    /// An accepted debit as the app is answered (docs/api.md: `{usage_id, amount, unit,
    /// period, used, remaining, replayed, allocation}`); `None` for a refusal. `unit` is the
    /// request's.
    pub fn accepted_body(&self, unit: &str) -> Option<serde_json::Value> {
        let Debit::Accepted {
            usage_id,
            amount,
            period,
            used,
            remaining,
            replayed,
            allocation,
        } = self
        else {
            return None;
        };
        // A debit stored before grants burned took all of it from the allowance.
        let allocation = allocation.clone().unwrap_or_else(|| Allocated {
            from_allowance: *amount,
            from_grants: Vec::new(),
            order_version: BURN_ORDER_VERSION,
        });
        Some(json!({
            "usage_id": usage_id,
            "amount": amount,
            "unit": unit,
            "period": period.as_str(),
            "used": used,
            "remaining": remaining,
            "replayed": replayed,
            "allocation": allocation,
        }))
    }
}

/// A debit's answer, and the ids of the `billing.allowance_exhausted` outbox row and of the
/// meter report it wrote, if it did: the caller hands them to the dispatcher's queue (the
/// rescue sends them otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debited {
    pub debit: Debit,
    pub told: Option<String>,
    pub reported: Option<String>,
}

/// The cause of the period's `billing.allowance_exhausted`: once per account and period.
fn exhausted_cause(source: &str, customer: &CustomerId, period: &Period) -> String {
    format!("allowance of {source}/{customer} for {period} exhausted")
}

/// The body of an effect a debit or a reversal writes (`billing.allowance_exhausted`,
/// `billing.usage_reversed`): the account's plan and features as read just before, which
/// neither moves (nor depends on the period); the statement that writes it adds the
/// sequence, the period's totals and the debit. `None` for an account that does not exist.
async fn usage_effect(
    conn: &mut PgConnection,
    (source, customer): (&str, &CustomerId),
    period: &Period,
    catalog: &Catalog,
    (kind, id): (Kind, &str),
) -> Result<Option<serde_json::Value>, sqlx::Error> {
    let Some(snapshot) = account::snapshot(conn, source, customer, period, catalog).await? else {
        return Ok(None);
    };
    Ok(Some(json!({
        "id": id,
        "type": kind.as_str(),
        "data": {
            "source": source,
            "customer_id": customer.as_str(),
            "period": period.as_str(),
            "account": {"plan": snapshot.plan, "features": snapshot.features, "period": period.as_str()},
        },
    })))
}

/// Spends `req.amount` of the period's allowance, then of the account's grants of `req.unit`
/// in the burn order, once per key, all or nothing: at most two round trips, one when effects
/// are off.
#[tracing::instrument(skip_all, fields(source = req.source, period = req.period.period().as_str()))]
pub async fn debit(
    conn: &mut PgConnection,
    req: &DebitRequest<'_>,
) -> Result<Debited, sqlx::Error> {
    let period = req.period.period();
    let effect = match req.effects {
        Some(catalog) => {
            let cause = exhausted_cause(req.source, req.customer, period);
            let id = effect_id(Kind::AllowanceExhausted, &cause);
            // The plan as read just before the debit: the debit does not move it. No
            // account, no debit either (accounts are never deleted, so no key of it exists).
            let account = (req.source, req.customer);
            let made = (Kind::AllowanceExhausted, id.as_str());
            let Some(effect) = usage_effect(conn, account, period, catalog, made).await? else {
                return Ok(Debited {
                    debit: Debit::UnknownCustomer,
                    told: None,
                    reported: None,
                });
            };
            // The plan's low level of the debit's unit: a debit that takes the unit's credits
            // below it writes the crossing (docs/design.md §4.14).
            let plan = effect["data"]["account"]["plan"]
                .as_str()
                .unwrap_or_default();
            let low = catalog.credits_low_of(plan).get(req.unit).copied();
            Some(json!({"id": id, "cause": cause, "body": effect, "credits_low": low}))
        }
        None => None,
    };
    let usage_id = format!("use_{}", uuid::Uuid::new_v4().simple());
    let meter = req.meter.map(|meter| {
        json!({
            "id": report_id(),
            "identifier": identifier(req.source, req.customer, req.key),
            "meter": meter,
        })
    });
    let row = sqlx::query!(
        r#"SELECT outcome AS "outcome!", usage_id, period, used, remaining,
                  replayed AS "replayed!", told, reported,
                  allocation
           FROM inbox_debit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"#,
        req.source,
        req.customer.as_str(),
        req.key,
        req.amount,
        period.as_str(),
        req.period.named(),
        req.note,
        usage_id,
        effect,
        meter,
        req.unit,
    )
    .fetch_one(exec(conn))
    .await?;
    let missing = |what: &str| sqlx::Error::Decode(format!("inbox_debit: no {what}").into());
    let bad = |e: serde_json::Error| sqlx::Error::Decode(format!("inbox_debit: {e}").into());
    let debit = match row.outcome.as_str() {
        "accepted" => Debit::Accepted {
            usage_id: row.usage_id.ok_or_else(|| missing("usage_id"))?,
            amount: req.amount,
            // The month the key's first request spent: a replay's, when it named none, may
            // be before this request's arrival.
            period: row
                .period
                .as_deref()
                .map(Period::parse)
                .transpose()
                .map_err(|e| sqlx::Error::Decode(format!("inbox_debit: {e}").into()))?
                .ok_or_else(|| missing("period"))?,
            used: row.used.ok_or_else(|| missing("used"))?,
            remaining: row.remaining.ok_or_else(|| missing("remaining"))?,
            replayed: row.replayed,
            allocation: row
                .allocation
                .map(serde_json::from_value)
                .transpose()
                .map_err(bad)?,
        },
        "allowance_exhausted" => Debit::Exhausted {
            remaining: row.remaining.ok_or_else(|| missing("remaining"))?,
            replayed: row.replayed,
            remains: row
                .allocation
                .map(serde_json::from_value)
                .transpose()
                .map_err(bad)?,
        },
        "idempotency_conflict" => Debit::KeyConflict,
        "customer_deleted" => Debit::CustomerDeleted,
        "unknown_customer" => Debit::UnknownCustomer,
        other => {
            return Err(sqlx::Error::Decode(
                format!("inbox_debit: unknown outcome '{other}'").into(),
            ))
        }
    };
    Ok(Debited {
        debit,
        told: row.told,
        reported: row.reported,
    })
}

/// The allocation of the account's accepted debits of `unit`, derived from what is stored
/// ([`credits::allocations`]): its grants of the unit and their ledger, its periods'
/// allowances and its accepted debits not reversed, in the order they were accepted. The
/// truth of what each debit took; `credit_spending` only caches its sum for the debit's check.
#[tracing::instrument(skip_all, fields(source))]
pub async fn allocations(
    conn: &mut PgConnection,
    (source, customer): (&str, &CustomerId),
    unit: &str,
) -> Result<Vec<credits::DebitAllocation>, sqlx::Error> {
    let bad = |e: String| sqlx::Error::Decode(format!("credits: {e}").into());
    let mut held = credits::Credits::new();
    let grants = sqlx::query!(
        r#"SELECT grant_id, origin, unit, scope, amount::text AS "amount!", category, priority,
                  inbox_secs(created_at) AS "created!", inbox_secs(effective_at) AS effective_at,
                  inbox_secs(expires_at) AS expires_at, inbox_secs(voided_at) AS voided_at,
                  inbox_secs(version_at) AS "updated!", version_key
           FROM credit_grants WHERE source = $1 AND customer_id = $2 AND unit = $3"#,
        source,
        customer.as_str(),
        unit,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    for g in grants {
        let origin = match g.origin.as_str() {
            "stripe_credit_grant" => credits::Origin::StripeCreditGrant,
            "catalog_pack" => credits::Origin::CatalogPack,
            "polar_meter_credit" => credits::Origin::PolarMeterCredit,
            other => return Err(bad(format!("unknown origin '{other}'"))),
        };
        let category = match g.category.as_str() {
            "paid" => credits::Category::Paid,
            "promotional" => credits::Category::Promotional,
            other => return Err(bad(format!("unknown category '{other}'"))),
        };
        held.grant(credits::GrantSnapshot {
            grant_id: g.grant_id,
            origin,
            unit: g.unit,
            scope: g.scope,
            amount: Quantity::parse(&g.amount).map_err(|e| bad(e.to_string()))?,
            category,
            priority: g.priority.and_then(|p| u8::try_from(p).ok()),
            created: g.created,
            effective_at: g.effective_at,
            expires_at: g.expires_at,
            voided_at: g.voided_at,
            updated: g.updated,
            event_key: g.version_key,
        });
    }
    let transactions = sqlx::query!(
        r#"SELECT t.transaction_id, t.grant_id, t.kind, t.amount::text AS "amount!",
                  inbox_secs(t.effective_at) AS "at!"
           FROM credit_transactions t JOIN credit_grants c
             ON c.source = t.source AND c.grant_id = t.grant_id
           WHERE c.source = $1 AND c.customer_id = $2 AND c.unit = $3"#,
        source,
        customer.as_str(),
        unit,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    for t in transactions {
        let kind = [
            credits::TransactionKind::Granted,
            credits::TransactionKind::ApplicationInvoiceVoided,
            credits::TransactionKind::Applied,
            credits::TransactionKind::Expired,
            credits::TransactionKind::Voided,
        ]
        .into_iter()
        .find(|k| k.as_str() == t.kind)
        .ok_or_else(|| bad(format!("unknown transaction kind '{}'", t.kind)))?;
        held.transaction(credits::Transaction {
            transaction_id: t.transaction_id,
            grant_id: t.grant_id,
            kind,
            amount: Quantity::parse(&t.amount).map_err(|e| bad(e.to_string()))?,
            effective_at: t.at,
        });
    }
    let allowances = sqlx::query!(
        r#"SELECT period, COALESCE(sum(delta), 0)::bigint AS "granted!" FROM ledger
           WHERE source = $1 AND customer_id = $2 GROUP BY period"#,
        source,
        customer.as_str(),
    )
    .fetch_all(exec(&mut *conn))
    .await?
    .into_iter()
    .map(|r| (r.period, Quantity::whole(r.granted)))
    .collect();
    let debits: Vec<credits::SpentDebit> = sqlx::query!(
        r#"SELECT usage_id, period, amount, inbox_secs(recorded_at) AS "at!" FROM usage_debits
           WHERE source = $1 AND customer_id = $2 AND unit = $3 AND accepted
             AND reversed_at IS NULL
           ORDER BY seq"#,
        source,
        customer.as_str(),
        unit,
    )
    .fetch_all(exec(&mut *conn))
    .await?
    .into_iter()
    .map(|d| credits::SpentDebit {
        usage_id: d.usage_id,
        unit: unit.to_owned(),
        period: d.period,
        amount: Quantity::whole(d.amount),
        at: d.at,
    })
    .collect();
    Ok(credits::allocations(&held, &allowances, &debits))
}

/// What a reversal got. Asked again, the same answer, but `replayed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reversal {
    Reversed {
        usage_id: String,
        amount: i64,
        period: Period,
        /// The period's used and remaining right after the reversal.
        used: i64,
        remaining: i64,
        reversed_at: DateTime<Utc>,
        replayed: bool,
    },
    /// No debit of this account has the id.
    UnknownUsage,
    /// The debit was refused: it spent nothing, so there is nothing to take back.
    NotAccepted,
}

impl Reversal {
    /// The answer's body (docs/api.md: `{usage_id, amount, period, used, remaining,
    /// reversed_at, replayed}`); `None` for a refusal.
    pub fn body(&self) -> Option<serde_json::Value> {
        let Reversal::Reversed {
            usage_id,
            amount,
            period,
            used,
            remaining,
            reversed_at,
            replayed,
        } = self
        else {
            return None;
        };
        Some(json!({
            "usage_id": usage_id,
            "amount": amount,
            "period": period.as_str(),
            "used": used,
            "remaining": remaining,
            "reversed_at": reversed_at,
            "replayed": replayed,
        }))
    }
}

/// A reversal's answer, and the ids of what it wrote for the dispatcher: its
/// `billing.usage_reversed` effect and the meter's correction (a report withdrawn needs no
/// send).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reversed {
    pub reversal: Reversal,
    pub told: Option<String>,
    pub correction: Option<String>,
}

/// Takes the accepted debit `usage_id` of the account back, once (docs/design.md §4.10): its
/// amount returns to its period's allowance, and its meter report, if it has one, is
/// withdrawn when it never went out or corrected at the provider otherwise (§4.13), in the
/// same statement. `effects`: the catalog when effects are on (`billing.usage_reversed`, its
/// `account` block naming the plan as of `today`); then two round trips, else one. An
/// unknown account is `UnknownUsage`: none of its debits exists.
#[tracing::instrument(skip_all, fields(source))]
pub async fn reverse(
    conn: &mut PgConnection,
    (source, customer): (&str, &CustomerId),
    usage_id: &str,
    effects: Option<&Catalog>,
    today: &Period,
) -> Result<Reversed, sqlx::Error> {
    let effect = match effects {
        Some(catalog) => {
            let cause = format!("debit {usage_id} of {source}/{customer} reversed");
            let id = effect_id(Kind::UsageReversed, &cause);
            let made = (Kind::UsageReversed, id.as_str());
            match usage_effect(conn, (source, customer), today, catalog, made).await? {
                Some(body) => Some(json!({"id": id, "cause": cause, "body": body})),
                None => {
                    return Ok(Reversed {
                        reversal: Reversal::UnknownUsage,
                        told: None,
                        correction: None,
                    })
                }
            }
        }
        None => None,
    };
    // The correction's dedupe key at the provider: its debit's, marked as the reversal's.
    let correction = json!({
        "id": report_id(),
        "identifier": correction_identifier(source, customer, usage_id),
    });
    let row = sqlx::query!(
        r#"SELECT outcome AS "outcome!", period, amount, used, remaining, reversed_at,
                  replayed AS "replayed!", told, correction
           FROM inbox_reverse_debit($1, $2, $3, $4, $5)"#,
        source,
        customer.as_str(),
        usage_id,
        effect,
        correction,
    )
    .fetch_one(exec(conn))
    .await?;
    let missing =
        |what: &str| sqlx::Error::Decode(format!("inbox_reverse_debit: no {what}").into());
    let reversal = match row.outcome.as_str() {
        "reversed" => Reversal::Reversed {
            usage_id: usage_id.to_owned(),
            amount: row.amount.ok_or_else(|| missing("amount"))?,
            period: row
                .period
                .as_deref()
                .map(Period::parse)
                .transpose()
                .map_err(|e| sqlx::Error::Decode(format!("inbox_reverse_debit: {e}").into()))?
                .ok_or_else(|| missing("period"))?,
            used: row.used.ok_or_else(|| missing("used"))?,
            remaining: row.remaining.ok_or_else(|| missing("remaining"))?,
            reversed_at: row.reversed_at.ok_or_else(|| missing("reversed_at"))?,
            replayed: row.replayed,
        },
        "unknown_usage" => Reversal::UnknownUsage,
        "not_accepted" => Reversal::NotAccepted,
        other => {
            return Err(sqlx::Error::Decode(
                format!("inbox_reverse_debit: unknown outcome '{other}'").into(),
            ))
        }
    };
    Ok(Reversed {
        reversal,
        told: row.told,
        correction: row.correction,
    })
}

/// One accepted debit, as the usage list shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageLine {
    pub usage_id: String,
    pub amount: i64,
    /// What it spent: `credits` (the allowance's unit), or the unit of the grants it spent.
    pub unit: String,
    pub idempotency_key: String,
    pub note: Option<String>,
    pub recorded_at: DateTime<Utc>,
}

/// A page of a period's usage, oldest first, with the period's totals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsagePage {
    pub period: String,
    pub allowance: i64,
    pub used: i64,
    pub remaining: i64,
    pub usage: Vec<UsageLine>,
    /// The cursor of the next page (`after`), when there is one.
    pub next: Option<String>,
}

/// What a usage list came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listed {
    Page(UsagePage),
    UnknownCustomer,
    /// `after` names no debit of this account and period: a cursor of another list, or none
    /// at all. Starting from the beginning instead would show the first page as if it were
    /// the next.
    UnknownCursor,
}

/// Lists the period's accepted debits, `limit` at a time, after the debit `after` names (an
/// opaque cursor: the `next` of an earlier page of this account and period).
#[tracing::instrument(skip_all, fields(source, period = period.as_str()))]
pub async fn list(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
    period: &Period,
    limit: i64,
    after: Option<&str>,
) -> Result<Listed, sqlx::Error> {
    let limit = limit.max(1);
    let row = sqlx::query!(
        r#"
        SELECT (a.deleted_at IS NOT NULL) AS "deleted!",
               ($4::text IS NULL OR EXISTS (SELECT 1 FROM usage_debits c
                                            WHERE c.usage_id = $4 AND c.source = $1
                                              AND c.customer_id = $2 AND c.period = $3))
                   AS "cursor_known!",
               (SELECT COALESCE(sum(delta), 0) FROM ledger
                WHERE source = $1 AND customer_id = $2 AND period = $3)::bigint AS "granted!",
               COALESCE((SELECT used FROM usage_periods
                         WHERE source = $1 AND customer_id = $2 AND period = $3), 0) AS "used!",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                           'usage_id', d.usage_id, 'amount', d.amount, 'unit', d.unit,
                           'idempotency_key', d.idempotency_key, 'note', d.note,
                           'recorded_at', d.recorded_at) ORDER BY d.seq), '[]')
                FROM (SELECT * FROM usage_debits u
                      WHERE u.source = $1 AND u.customer_id = $2 AND u.period = $3 AND u.accepted
                        AND u.reversed_at IS NULL
                        AND u.seq > COALESCE((SELECT seq FROM usage_debits c
                                              WHERE c.usage_id = $4 AND c.source = $1
                                                AND c.customer_id = $2 AND c.period = $3), 0)
                      ORDER BY u.seq LIMIT $5::bigint + 1) d) AS "usage!"
        FROM accounts a WHERE a.source = $1 AND a.customer_id = $2
        "#,
        source,
        customer.as_str(),
        period.as_str(),
        after,
        limit,
    )
    .fetch_optional(exec(conn))
    .await?;
    let Some(row) = row else {
        return Ok(Listed::UnknownCustomer);
    };
    if !row.cursor_known {
        return Ok(Listed::UnknownCursor);
    }
    #[derive(serde::Deserialize)]
    struct Line {
        usage_id: String,
        amount: i64,
        unit: String,
        idempotency_key: String,
        note: Option<String>,
        recorded_at: DateTime<Utc>,
    }
    let mut lines: Vec<Line> = serde_json::from_value(row.usage)
        .map_err(|e| sqlx::Error::Decode(format!("usage: {e}").into()))?;
    // One more than asked for says whether there is a next page.
    let more = lines.len() as i64 > limit;
    lines.truncate(limit as usize);
    let (allowance, remaining) = period_totals(row.deleted, row.granted, row.used);
    let usage: Vec<UsageLine> = lines
        .into_iter()
        .map(|l| UsageLine {
            usage_id: l.usage_id,
            amount: l.amount,
            unit: l.unit,
            idempotency_key: l.idempotency_key,
            note: l.note,
            recorded_at: l.recorded_at,
        })
        .collect();
    Ok(Listed::Page(UsagePage {
        period: period.to_string(),
        allowance,
        used: row.used,
        remaining,
        next: usage.last().filter(|_| more).map(|l| l.usage_id.clone()),
        usage,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debit_is_checked_by_one_rule_for_the_api_and_the_cli() {
        let customer = CustomerId::parse("kc_1").unwrap();
        let today = Period::parse("2026-12").unwrap();
        let ask =
            |key: &'static str, amount: i64, period: Option<&str>, note: Option<&'static str>| {
                DebitRequest::checked("kinde", &customer, key, amount, period, note, None, &today)
            };
        let named = ask("k", MAX_AMOUNT, Some("2026-11"), Some("a\tb\nc")).unwrap();
        assert_eq!(
            named.period,
            DebitPeriod::Named(Period::parse("2026-11").unwrap())
        );
        assert_eq!(
            ask("k", 1, None, None).unwrap().period,
            DebitPeriod::Arrival(today.clone()),
            "no period named: the month of arrival, kept apart from a named one"
        );
        let invalid = |r: Result<DebitRequest<'_>, Invalid>| r.unwrap_err().code();
        assert_eq!(invalid(ask("k", 0, None, None)), "bad_amount");
        assert_eq!(invalid(ask("k", MAX_AMOUNT + 1, None, None)), "bad_amount");
        assert_eq!(invalid(ask("k", 1, Some("2027-01"), None)), "future_period");
        assert_eq!(invalid(ask("k", 1, Some("2026-13"), None)), "bad_period");
        assert_eq!(invalid(ask("", 1, None, None)), "bad_idempotency_key");
        assert_eq!(invalid(ask("a b", 1, None, None)), "bad_idempotency_key");
        let long = "é".repeat(MAX_NOTE_CHARS + 1);
        let too_long =
            DebitRequest::checked("kinde", &customer, "k", 1, None, Some(&long), None, &today);
        assert_eq!(invalid(too_long), "bad_note");
        let longest = "é".repeat(MAX_NOTE_CHARS);
        assert!(DebitRequest::checked(
            "kinde",
            &customer,
            "k",
            1,
            None,
            Some(&longest),
            None,
            &today
        )
        .is_ok());
        assert_eq!(invalid(ask("k", 1, None, Some("a\u{0}b"))), "bad_note");
        assert_eq!(invalid(ask("k", 1, None, Some("\u{1b}[2J"))), "bad_note");
        assert_eq!(ask("k", 1, None, None).unwrap().unit, ALLOWANCE_UNIT);
        let in_unit = |unit: &'static str| {
            DebitRequest::checked("kinde", &customer, "k", 1, None, None, Some(unit), &today)
        };
        assert_eq!(in_unit("usd").unwrap().unit, "usd");
        assert!(in_unit("cpu_61SsXy-2").is_ok());
        for bad in ["", "us d", "usd\n", "é", &"u".repeat(MAX_UNIT_LEN + 1)] {
            let bad: &'static str = Box::leak(bad.to_owned().into_boxed_str());
            assert_eq!(invalid(in_unit(bad)), "bad_unit", "{bad:?}");
        }
    }
}
