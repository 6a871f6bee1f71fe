//! The billing model as plain values and functions (docs/design.md §4): the effects an event
//! asks for, who an event is about and the version that orders writes to one register, what
//! a register write did, what a grant is, which outcome an event has, and the plan and
//! balance an account derives from its registers. No I/O: the providers' `decide` functions
//! and the register rules build these values; `registers` persists them.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::credits::{GrantSnapshot, Transaction};
use crate::domain::catalog::CreditPack;
use crate::domain::features::{self, Features};
use crate::domain::{Catalog, CustomerId, DedupeKey, EventStatus, Period, PlanRef, ProviderTime};

/// A register's version: the provider's time, then the dedupe key, so the order is total.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub at: ProviderTime,
    pub key: DedupeKey,
}

/// Who an event is about and where it sits in the provider's order: what the register rules
/// stamp its writes with, and the cause the effects of those writes name (`effects`).
#[derive(Debug, Clone)]
pub struct EventContext<'a> {
    pub event_id: i64,
    pub source: &'a str,
    pub customer: &'a CustomerId,
    pub event_type: &'a str,
    /// The provider's id of the event (its dedupe key), as its effects name it.
    pub dedupe_key: &'a DedupeKey,
    pub version: Version,
}

/// The ledger key that makes a grant happen once per account, period and plan.
pub fn allowance_entry_key(
    source: &str,
    customer: &CustomerId,
    period: &Period,
    plan: &str,
) -> String {
    format!("allowance:{source}/{customer}:{period}:{plan}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentStatus {
    Paid,
    Failed,
    Refunded,
}

impl PaymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Paid => "paid",
            Self::Failed => "failed",
            Self::Refunded => "refunded",
        }
    }
}

/// A subscription status entitles its customer while `active` or `trialing`.
pub fn status_entitles(status: &str) -> bool {
    matches!(status, "active" | "trialing")
}

/// Where a write stands among writes to one register at the same provider time: the second
/// part of a version, between the time and the dedupe key (docs/design.md §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rank(pub i64);

/// What provider reads settled for an event when it was applied, kept with the event
/// (`inbox_events.settled`) so that the fold of the account's events repeats it
/// (docs/design.md §4.11): the rank a same-second tie's read gave each subscription state,
/// and the invoices a refund's payment intents were linked to by a read.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Settled {
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ranks: std::collections::BTreeMap<String, i64>,
    /// (payment intent, invoice), in the order they were written before the refund.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<(String, String)>,
}

impl Settled {
    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty() && self.links.is_empty()
    }

    /// The event's effects as the worker applied them: each settled rank in place of the
    /// status rank, and the links read before the refund that needed them.
    pub fn apply_to(&self, effects: &mut Vec<Effect>) {
        for effect in effects.iter_mut() {
            if let Effect::Subscription { id, rank, .. } = effect {
                if let Some(settled) = self.ranks.get(id) {
                    *rank = Rank(*settled);
                }
            }
        }
        for (i, (payment_intent, invoice)) in self.links.iter().enumerate() {
            effects.insert(
                i,
                Effect::PaymentIntent {
                    payment_intent: payment_intent.clone(),
                    invoice: invoice.clone(),
                },
            );
        }
    }
}

impl Rank {
    /// A tie lost to a provider read that showed the other event's state.
    pub const REFUTED: Rank = Rank(-1);
    /// Where the ranks of ties won by a provider read start, above every status rank.
    const CONFIRMED_FLOOR: i64 = 1000;

    /// A tie won by a provider read, made at `read_at`, that showed this event's state. The
    /// rank grows with the read's time: of two states the provider confirmed, the one it
    /// showed last is the newer (a constant would tie them and leave the dedupe key to choose).
    pub fn confirmed(read_at: chrono::DateTime<chrono::Utc>) -> Rank {
        Rank(Self::CONFIRMED_FLOOR + read_at.timestamp_micros().max(0))
    }

    /// The documented progression of a subscription's status (Stripe's and Polar's share
    /// one vocabulary): a subscription moves forward along it, so of two states stamped with
    /// the same second the later one in this order is the newer. Unknown statuses rank first.
    pub fn of_status(status: &str) -> Rank {
        Rank(match status {
            "incomplete" => 1,
            "trialing" => 2,
            "active" => 3,
            "paused" => 4,
            "past_due" => 5,
            "unpaid" => 6,
            "canceled" | "incomplete_expired" => 7,
            _ => 0,
        })
    }

    /// A payment moves from failed (a retry may follow) to paid to refunded.
    pub fn of_payment(status: PaymentStatus) -> Rank {
        Rank(match status {
            PaymentStatus::Failed => 1,
            PaymentStatus::Paid => 2,
            PaymentStatus::Refunded => 3,
        })
    }
}

/// One write an event asks for. Each is applied by one conditional statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The customer's plan register: the plan key the event names (`None`: a cancelled
    /// agreement) and the catalog's plan for it (`None` also when the key is unknown).
    CustomerPlan {
        plan: Option<PlanRef>,
        key: Option<String>,
    },
    /// The customer's payment standing register (Kinde).
    Standing { past_due: bool },
    /// A subscription's register: the whole object's status, plan and ends. `rank` orders
    /// it among same-second states (its status's, unless a provider read settled a tie).
    Subscription {
        id: String,
        status: String,
        plan: Option<PlanRef>,
        ends: SubscriptionEnds,
        rank: Rank,
    },
    /// A payment's register; refunded is terminal.
    Payment {
        id: String,
        status: PaymentStatus,
        plan_key: Option<String>,
    },
    /// The plan's allowance for the period of the event's provider time.
    Grant { plan: PlanRef },
    /// A paid invoice whose lines name no plan the catalog knows (Stripe): it grants the plan
    /// its subscription's register holds. `subscriptions`: the ids the invoice names, from
    /// every place the API versions put them; `read`: the paths read, for the reason when
    /// nothing tells the plan (docs/design.md §6.2). The worker turns it into a `Grant` (and
    /// the payment's plan), or into nothing and a note, against the registers as read
    /// ([`Registers::plan_of_subscription`](super::rules::Registers::plan_of_subscription)).
    GrantOfSubscription {
        payment: String,
        subscriptions: Vec<String>,
        read: String,
    },
    /// A payment intent belongs to this invoice (Stripe): a refund of the intent ends it.
    PaymentIntent {
        payment_intent: String,
        invoice: String,
    },
    /// A full refund of a charge that names its payment intent but not its invoice (Stripe's
    /// API from 2025-03-31 on): it ends the invoice the intent belongs to, once known.
    RefundIntent {
        charge: String,
        payment_intent: String,
    },
    /// The customer is deleted: a tombstone later events cannot lift.
    DeleteCustomer,
    /// One of the customer's entitlement registers (docs/design.md §4.12): a provider's grant
    /// of features, by the grant's id — Stripe's active-entitlement summary (one per customer,
    /// the whole set), a Polar benefit grant, Kinde's entitlements as read. `active: false`
    /// (revoked, ended) gives nothing; the account has the features of its active ones.
    /// `rank` orders it among same-second states: 0, unless it is the provider's word read
    /// for a tie (a Stripe summary's list read, confirmed at the read's time).
    Entitlement {
        grant: String,
        active: bool,
        features: Features,
        rank: Rank,
    },
    /// A credit grant's snapshot (docs/design.md §4.14): Stripe's `billing.credit_grant`. Its
    /// register keeps the latest snapshot and the earliest void.
    CreditGrant(GrantSnapshot),
    /// A ledger entry of a credit grant (Stripe's `billing.credit_balance_transaction`), once
    /// by its id. It names its grant, not its customer: the event belongs to the grant's.
    CreditTransaction(Transaction),
    /// A paid payment of a price whose catalog entry is a credit pack: the pack's grant, keyed
    /// by the payment (`pack:{payment}:{price}`), so a copy or a replay never mints twice;
    /// `quantity` packs of the price in one grant. A refund of the payment voids it.
    PackBought {
        payment: String,
        price: String,
        pack: CreditPack,
        quantity: u32,
    },
}

/// What an event means for the billing state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The writes, and what the event's log line should say besides what they did (an
    /// unknown plan, which payload field named the customer).
    Apply {
        effects: Vec<Effect>,
        notes: Vec<String>,
    },
    /// Nothing to do, and why.
    Ignore(String),
    /// The payload cannot be read as this event type; retrying cannot help.
    Unprocessable(String),
}

impl Decision {
    pub fn apply(effects: Vec<Effect>) -> Self {
        Self::Apply {
            effects,
            notes: Vec::new(),
        }
    }

    /// The same decision with a note for the log line (an `Apply` only).
    pub fn noted(mut self, note: Option<String>) -> Self {
        if let (Self::Apply { notes, .. }, Some(note)) = (&mut self, note) {
            notes.push(note);
        }
        self
    }
}

/// Why a provider's `decide` could not reach a decision: the payload cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem(pub String);

impl From<Problem> for Decision {
    fn from(problem: Problem) -> Self {
        Decision::Unprocessable(problem.0)
    }
}

/// A plan as an event names it: known to the catalog, or not (then no plan, and why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub plan: Option<PlanRef>,
    pub note: Option<String>,
}

/// What a provider's `decide` returns: a decision, or why there is none.
pub type Decided = Result<Decision, Problem>;

/// The reading helpers every provider's `decide` uses on its payload.
pub mod read {
    use super::*;

    /// A non-blank string at a JSON pointer.
    pub fn text<'a>(payload: &'a Value, pointer: &str) -> Option<&'a str> {
        payload
            .pointer(pointer)
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
    }

    pub fn required<'a>(payload: &'a Value, pointer: &str) -> Result<&'a str, Problem> {
        text(payload, pointer).ok_or_else(|| Problem(format!("no {pointer} in the payload")))
    }

    pub fn first_text<'a>(payload: &'a Value, pointers: &[&str]) -> Option<&'a str> {
        pointers.iter().find_map(|p| text(payload, p))
    }

    /// A time in unix seconds at a JSON pointer (Stripe's timestamps); absent or `null` is
    /// `None`.
    pub fn unix_time(payload: &Value, pointer: &str) -> Result<Option<DateTime<Utc>>, Problem> {
        match payload.pointer(pointer) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_i64()
                .and_then(|secs| DateTime::from_timestamp(secs, 0))
                .map(Some)
                .ok_or_else(|| Problem(format!("{pointer} is not a time in unix seconds"))),
        }
    }

    /// An RFC 3339 time at a JSON pointer (Polar's timestamps), to the microsecond Postgres
    /// keeps; absent or `null` is `None`.
    pub fn iso_time(payload: &Value, pointer: &str) -> Result<Option<DateTime<Utc>>, Problem> {
        match payload.pointer(pointer) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value
                .as_str()
                .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                .and_then(|t| DateTime::from_timestamp_micros(t.timestamp_micros()))
                .map(Some)
                .ok_or_else(|| Problem(format!("{pointer} is not an RFC 3339 time"))),
        }
    }

    /// A boolean at a JSON pointer; absent or `null` is `false`.
    pub fn flag(payload: &Value, pointer: &str) -> Result<bool, Problem> {
        match payload.pointer(pointer) {
            None | Some(Value::Null) => Ok(false),
            Some(value) => value
                .as_bool()
                .ok_or_else(|| Problem(format!("{pointer} is not a boolean"))),
        }
    }

    /// Resolves plan keys against the catalog. A named but unknown key is no plan, never a
    /// reason to drop the rest of the event: the note says which key was not known.
    pub fn resolve(catalog: &Catalog, candidates: &[&str]) -> Resolved {
        match catalog.resolve(candidates) {
            Ok(plan) => Resolved { plan, note: None },
            Err(key) => Resolved {
                plan: None,
                note: Some(format!("no plan: '{key}' is not in the plan catalog")),
            },
        }
    }
}

/// The effects, plus the plan's grant when there is a plan.
pub fn with_grant(mut effects: Vec<Effect>, plan: &Option<PlanRef>) -> Vec<Effect> {
    if let Some(plan) = plan {
        effects.push(Effect::Grant { plan: plan.clone() });
    }
    effects
}

/// An event type the provider sends that says nothing about billing.
pub fn no_meaning(event_type: &str) -> Decision {
    Decision::Ignore(format!("{event_type} carries no billing state"))
}

/// An event type that is not a billing event at all.
pub fn not_billing(event_type: &str) -> Decision {
    Decision::Ignore(format!("event type {event_type} is not a billing event"))
}

/// A subscription event records the object's state, whatever its plan; an entitling state
/// also grants its plan for the event's period.
pub fn subscription_effects(
    id: String,
    status: String,
    ends: SubscriptionEnds,
    resolved: Resolved,
) -> Decision {
    let grant = if status_entitles(&status) {
        resolved.plan.clone()
    } else {
        None
    };
    let rank = Rank::of_status(&status);
    Decision::apply(with_grant(
        vec![Effect::Subscription {
            id,
            status,
            plan: resolved.plan,
            ends,
            rank,
        }],
        &grant,
    ))
    .noted(resolved.note)
}

/// The keys of a payment that may name its plan: a key the catalog knows only as a credit pack
/// names none (its payment is a pack's, not a plan's).
pub fn plan_candidates<'a>(keys: &[&'a str], catalog: &Catalog) -> Vec<&'a str> {
    keys.iter()
        .copied()
        .filter(|k| catalog.get(k).is_some() || catalog.pack(k).is_none())
        .collect()
}

/// The credit packs a paid payment buys: one [`Effect::PackBought`] per (key, quantity) the
/// catalog gives a pack (docs/design.md §4.14). A key named twice is one grant of the sum.
pub fn packs_bought(payment: &str, keys: &[(&str, u32)], catalog: &Catalog) -> Vec<Effect> {
    let mut bought: Vec<(&str, u32)> = Vec::new();
    for (key, quantity) in keys {
        if catalog.pack(key).is_none() {
            continue;
        }
        match bought.iter_mut().find(|(k, _)| k == key) {
            Some((_, q)) => *q = q.saturating_add(*quantity),
            None => bought.push((key, *quantity)),
        }
    }
    bought
        .into_iter()
        .filter_map(|(key, quantity)| {
            Some(Effect::PackBought {
                payment: payment.to_owned(),
                price: key.to_owned(),
                pack: catalog.pack(key)?.clone(),
                quantity: quantity.max(1),
            })
        })
        .collect()
}

/// A paid payment of the keys it names: the plan the first known one names (granted for the
/// event's period), and the credit packs any of them buys.
pub fn paid_with_packs(id: String, keys: &[&str], catalog: &Catalog) -> Decision {
    let packs = packs_bought(
        &id,
        &keys.iter().map(|k| (*k, 1)).collect::<Vec<_>>(),
        catalog,
    );
    let decision = paid(id, read::resolve(catalog, &plan_candidates(keys, catalog)));
    match decision {
        Decision::Apply { mut effects, notes } => {
            effects.extend(packs);
            Decision::Apply { effects, notes }
        }
        other => other,
    }
}

/// A payment of the plan an event names (if any), which it grants for the event's period.
pub fn paid(id: String, resolved: Resolved) -> Decision {
    Decision::apply(with_grant(
        vec![Effect::Payment {
            id,
            status: PaymentStatus::Paid,
            plan_key: resolved.plan.as_ref().map(|p| p.key.clone()),
        }],
        &resolved.plan,
    ))
    .noted(resolved.note)
}

/// A subscription's state as the app sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionState {
    pub status: String,
    /// The catalog's plan name, when the subscription's plan is in the catalog.
    pub plan: Option<String>,
    pub ends: SubscriptionEnds,
}

/// When a subscription's period, trial and the subscription itself end, as the object the
/// winning event carries says (docs/design.md §4.4): each `None` (`false`) when it says
/// nothing. Part of the state: scheduling or withdrawing a cancellation is a change.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubscriptionEnds {
    pub current_period_end: Option<DateTime<Utc>>,
    /// It ends when the current period does (a cancellation scheduled, not yet effective).
    pub cancel_at_period_end: bool,
    /// It ends at this time (Stripe's `cancel_at`, Polar's `ends_at`).
    pub cancel_at: Option<DateTime<Utc>>,
    pub trial_end: Option<DateTime<Utc>>,
    /// It has ended (the time it did).
    pub ended_at: Option<DateTime<Utc>>,
}

impl SubscriptionEnds {
    /// The ends in words, as the account view shows them: "until 2026-12-31, cancels at
    /// period end"; empty when nothing is known.
    pub fn words(&self) -> String {
        let day = |t: &DateTime<Utc>| t.format("%Y-%m-%d").to_string();
        let mut words = Vec::new();
        if let Some(ended) = &self.ended_at {
            words.push(format!("ended {}", day(ended)));
        } else if let Some(end) = &self.current_period_end {
            words.push(format!("until {}", day(end)));
        }
        if let Some(trial) = &self.trial_end {
            words.push(format!("trial until {}", day(trial)));
        }
        if self.ended_at.is_none() {
            if self.cancel_at_period_end {
                words.push("cancels at period end".to_owned());
            } else if let Some(at) = &self.cancel_at {
                words.push(format!("cancels on {}", day(at)));
            }
        }
        words.join(", ")
    }

    /// What moved from `before` to these ends, in words ("cancels at period end", "no longer
    /// cancels at period end"); empty when nothing did.
    pub fn changes_from(&self, before: &SubscriptionEnds) -> String {
        let day = |t: &Option<DateTime<Utc>>| match t {
            Some(t) => t.format("%Y-%m-%d").to_string(),
            None => "none".to_owned(),
        };
        let mut words = Vec::new();
        match (before.cancel_at_period_end, self.cancel_at_period_end) {
            (false, true) => words.push("cancels at period end".to_owned()),
            (true, false) => words.push("no longer cancels at period end".to_owned()),
            _ => {}
        }
        // A cancellation at period end sets the cancellation time to the period end, and its
        // withdrawal clears it: the flag's words say both.
        let follows_flag = before.cancel_at_period_end != self.cancel_at_period_end
            && (self.cancel_at.is_none() || self.cancel_at == self.current_period_end);
        let dates = [
            (
                "period ends",
                &before.current_period_end,
                &self.current_period_end,
            ),
            ("cancels on", &before.cancel_at, &self.cancel_at),
            ("trial ends", &before.trial_end, &self.trial_end),
            ("ended", &before.ended_at, &self.ended_at),
        ];
        for (what, was, now) in dates {
            if was != now && !(what == "cancels on" && follows_flag) {
                words.push(format!("{what} {} (was {})", day(now), day(was)));
            }
        }
        words.join(", ")
    }
}

/// A change a register write made, in the terms an app is told of it (an effect,
/// docs/design.md §11).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    Subscription {
        id: String,
        now: SubscriptionState,
        previous: Option<SubscriptionState>,
    },
    Payment {
        id: String,
        status: PaymentStatus,
        previous: Option<String>,
    },
    /// A ledger entry: `amount` added to the period's balance.
    Granted {
        plan: String,
        period: Period,
        amount: i64,
        entry_key: String,
    },
    Deleted,
}

/// What one effect did to its register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The register moved; the words say how.
    Made(String),
    /// The register already holds this very event: re-applying it is a no-op.
    AlreadyApplied(String),
    /// The register holds something that wins over this event; the words say what.
    Superseded(String),
    /// The register took this event's version, but already held the same state: nothing a
    /// reader sees moved.
    Unchanged(String),
}

/// What a register write did, and, when it changed something an app is told of, that fact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub change: Change,
    pub fact: Option<Fact>,
    /// A subscription write: the other event whose state the register held at the same
    /// provider time, before this write (a tie the status rank settled).
    pub tied_with: Option<i64>,
}

impl From<Change> for Written {
    fn from(change: Change) -> Self {
        Self {
            change,
            fact: None,
            tied_with: None,
        }
    }
}

/// An event is applied when one of its writes took effect, or all of them already hold this
/// very event (a replay); it is ignored, with the first reason, when something newer won or
/// nothing moved. The notes follow the reason whatever the outcome.
pub fn outcome(changes: &[Change], notes: &[String]) -> (EventStatus, String) {
    let (status, mut reason) = outcome_of(changes);
    for note in notes {
        reason.push_str("; ");
        reason.push_str(note);
    }
    (status, reason)
}

fn outcome_of(changes: &[Change]) -> (EventStatus, String) {
    let made: Vec<&str> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Made(words) => Some(words.as_str()),
            _ => None,
        })
        .collect();
    let superseded = changes.iter().find_map(|c| match c {
        Change::Superseded(words) | Change::Unchanged(words) => Some(words.as_str()),
        _ => None,
    });
    let kept: Vec<&str> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Made(_) => None,
            Change::AlreadyApplied(words)
            | Change::Superseded(words)
            | Change::Unchanged(words) => Some(words.as_str()),
        })
        .collect();
    match (made.is_empty(), superseded) {
        (false, _) if kept.is_empty() => (EventStatus::Applied, made.join("; ")),
        (false, _) => (
            EventStatus::Applied,
            format!("{}; {}", made.join("; "), kept.join("; ")),
        ),
        (true, Some(words)) => (EventStatus::Ignored, words.to_owned()),
        (true, None) if kept.is_empty() => (EventStatus::Ignored, "nothing to change".into()),
        (true, None) => (EventStatus::Applied, kept.join("; ")),
    }
}

pub const FREE: &str = "free";

/// The account's plan, derived from its registers: the best entitlement it holds, `free`
/// when none. A tombstoned customer holds nothing.
pub fn derive_plan<'a>(
    deleted: bool,
    customer_plan: Option<&'a str>,
    past_due: bool,
    entitling_subscription_plans: impl IntoIterator<Item = &'a str>,
    catalog: &Catalog,
) -> String {
    if deleted {
        return FREE.to_owned();
    }
    let kinde = customer_plan.filter(|_| !past_due);
    kinde
        .into_iter()
        .chain(entitling_subscription_plans)
        .max_by_key(|plan| (catalog.allowance_of(plan).unwrap_or(0), plan.to_string()))
        .map(str::to_owned)
        .unwrap_or_else(|| FREE.to_owned())
}

/// The account as an effect tells it (docs/design.md §11): the derived plan and, for one
/// period, the balance (the period's allowance), what was spent of it and what is left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountState {
    pub plan: String,
    /// The catalog's features of the plan joined with the provider's active entitlements
    /// (docs/design.md §4.12); none for a deleted customer.
    pub features: Features,
    pub balance: i64,
    pub used: i64,
    pub remaining: i64,
    pub period: Period,
}

/// An account's registers as read, for one period: what [`AccountState::derive`] derives
/// the account's state from. `granted` is the period's ledger sum, `used` its accepted debits.
#[derive(Debug, Clone, Copy)]
pub struct StateInputs<'a> {
    pub deleted: bool,
    pub customer_plan: Option<&'a str>,
    pub past_due: bool,
    pub granted: i64,
    pub used: i64,
    /// The join of the features of the account's active entitlement registers.
    pub entitlements: &'a Features,
}

impl AccountState {
    /// The one derivation of an account's state (docs/design.md §4.10), used by the account
    /// snapshot, `inboxctl account` and the effects' `account` block: the plan from the
    /// registers and the catalog; the period's allowance, its largest grant, 0 for a deleted
    /// customer (whatever was granted before the deletion arrived); `remaining` never below 0.
    pub fn derive<'a>(
        inputs: StateInputs<'a>,
        entitling_subscription_plans: impl IntoIterator<Item = &'a str>,
        period: &Period,
        catalog: &Catalog,
    ) -> Self {
        let plan = derive_plan(
            inputs.deleted,
            inputs.customer_plan,
            inputs.past_due,
            entitling_subscription_plans,
            catalog,
        );
        let (balance, remaining) = period_totals(inputs.deleted, inputs.granted, inputs.used);
        let features = account_features(inputs.deleted, &plan, inputs.entitlements, catalog);
        AccountState {
            plan,
            features,
            balance,
            used: inputs.used,
            remaining,
            period: period.clone(),
        }
    }
}

/// An account's features (docs/design.md §4.12): its plan's in the catalog joined with its
/// active entitlements' (the larger value of a key both give); a deleted customer has none.
pub fn account_features(
    deleted: bool,
    plan: &str,
    entitlements: &Features,
    catalog: &Catalog,
) -> Features {
    if deleted {
        return Features::new();
    }
    let mut out = catalog.features_of(plan);
    features::join(&mut out, entitlements);
    out
}

/// A period's allowance and what is left of it, from its ledger sum and accepted debits: a
/// deleted customer holds nothing, and nothing left is 0, never less.
pub fn period_totals(deleted: bool, granted: i64, used: i64) -> (i64, i64) {
    let allowance = if deleted { 0 } else { granted };
    (allowance, (allowance - used).max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"{"pro":{"plan":"pro","monthly_allowance":500},
                "prod_team":{"plan":"team","monthly_allowance":2000}}"#,
        )
        .unwrap()
    }

    #[test]
    fn the_account_state_is_the_plan_the_periods_allowance_what_was_used_and_what_is_left() {
        let period = Period::parse("2026-03").unwrap();
        let inputs = StateInputs {
            deleted: false,
            customer_plan: None,
            past_due: false,
            granted: 500,
            used: 120,
            entitlements: &Features::new(),
        };
        let state = AccountState::derive(inputs, ["pro"], &period, &catalog());
        assert_eq!(
            (
                state.plan.as_str(),
                state.balance,
                state.used,
                state.remaining
            ),
            ("pro", 500, 120, 380)
        );
        let spent = StateInputs {
            used: 500,
            ..inputs
        };
        assert_eq!(
            AccountState::derive(spent, ["pro"], &period, &catalog()).remaining,
            0
        );
        // A deleted customer holds nothing and is on no plan; what it spent stays spent.
        let deleted = StateInputs {
            deleted: true,
            ..inputs
        };
        let state = AccountState::derive(deleted, ["pro"], &period, &catalog());
        assert_eq!(
            (
                state.plan.as_str(),
                state.balance,
                state.used,
                state.remaining
            ),
            (FREE, 0, 120, 0)
        );
    }

    #[test]
    fn nothing_left_is_zero_never_less() {
        assert_eq!(period_totals(false, 100, 30), (100, 70));
        assert_eq!(period_totals(false, 100, 130), (100, 0));
        assert_eq!(period_totals(true, 100, 30), (0, 0));
    }

    #[test]
    fn derived_plan_is_the_best_entitlement() {
        let c = catalog();
        assert_eq!(derive_plan(false, None, false, [], &c), "free");
        assert_eq!(derive_plan(false, Some("pro"), false, ["team"], &c), "team");
        assert_eq!(derive_plan(false, Some("pro"), true, [], &c), "free");
        assert_eq!(derive_plan(true, Some("pro"), false, ["team"], &c), "free");
    }

    #[test]
    fn outcome_words() {
        let made = Change::Made("plan set to pro".into());
        let newer = Change::Superseded("a newer plan change is already stored".into());
        let granted = Change::Superseded("the pro allowance for 2026-03 is already granted".into());
        let again = Change::AlreadyApplied("this plan change is already stored".into());
        assert_eq!(
            outcome(std::slice::from_ref(&made), &[]).0,
            EventStatus::Applied
        );
        assert_eq!(
            outcome(std::slice::from_ref(&newer), &[]),
            (
                EventStatus::Ignored,
                "a newer plan change is already stored".to_owned()
            )
        );
        assert_eq!(
            outcome(&[newer, granted.clone()], &[]).0,
            EventStatus::Ignored
        );
        assert_eq!(outcome(&[made, granted], &[]).0, EventStatus::Applied);
        assert_eq!(outcome(&[again], &[]).0, EventStatus::Applied);
        assert_eq!(
            outcome(&[Change::Made("plan set to pro".into())], &["note".into()]).1,
            "plan set to pro; note"
        );
    }

    #[test]
    fn ends_read_as_the_account_view_shows_them_and_say_what_moved() {
        let day =
            |d: u32| Some(chrono::TimeZone::with_ymd_and_hms(&Utc, 2026, 12, d, 0, 0, 0).unwrap());
        let scheduled = SubscriptionEnds {
            current_period_end: day(31),
            cancel_at_period_end: true,
            ..Default::default()
        };
        assert_eq!(scheduled.words(), "until 2026-12-31, cancels at period end");
        let running = SubscriptionEnds {
            cancel_at_period_end: false,
            ..scheduled.clone()
        };
        assert_eq!(running.words(), "until 2026-12-31");
        assert_eq!(scheduled.changes_from(&running), "cancels at period end");
        let scheduled_on = SubscriptionEnds {
            cancel_at: scheduled.current_period_end,
            ..scheduled.clone()
        };
        assert_eq!(scheduled_on.changes_from(&running), "cancels at period end");
        assert_eq!(
            running.changes_from(&scheduled_on),
            "no longer cancels at period end"
        );
        let on_a_date = SubscriptionEnds {
            cancel_at: day(15),
            ..running.clone()
        };
        assert_eq!(
            on_a_date.changes_from(&running),
            "cancels on 2026-12-15 (was none)"
        );
        assert_eq!(
            running.changes_from(&scheduled),
            "no longer cancels at period end"
        );
        let renewed = SubscriptionEnds {
            current_period_end: day(1),
            ..running.clone()
        };
        assert_eq!(
            renewed.changes_from(&running),
            "period ends 2026-12-01 (was 2026-12-31)"
        );
        assert_eq!(SubscriptionEnds::default().words(), "");
    }

    #[test]
    fn times_read_as_unix_seconds_or_rfc_3339_and_anything_else_is_a_problem() {
        let p = serde_json::json!({"a": 1767225600, "b": null, "c": "soon",
                                   "d": "2026-01-01T10:00:03.118204Z", "e": true});
        assert_eq!(
            read::unix_time(&p, "/a").unwrap(),
            DateTime::from_timestamp(1_767_225_600, 0)
        );
        assert_eq!(read::unix_time(&p, "/b").unwrap(), None);
        assert_eq!(read::unix_time(&p, "/missing").unwrap(), None);
        assert_eq!(
            read::unix_time(&p, "/c"),
            Err(Problem("/c is not a time in unix seconds".into()))
        );
        assert_eq!(
            read::iso_time(&p, "/d")
                .unwrap()
                .unwrap()
                .timestamp_micros(),
            1_767_261_603_118_204
        );
        assert_eq!(
            read::iso_time(&p, "/a"),
            Err(Problem("/a is not an RFC 3339 time".into()))
        );
        assert_eq!(read::flag(&p, "/e"), Ok(true));
        assert_eq!(read::flag(&p, "/b"), Ok(false));
        assert_eq!(
            read::flag(&p, "/a"),
            Err(Problem("/a is not a boolean".into()))
        );
    }

    #[test]
    fn an_unknown_plan_is_no_plan_and_keeps_the_status() {
        let unknown = read::resolve(&catalog(), &["price_legacy"]);
        assert_eq!(unknown.plan, None);
        let Decision::Apply { effects, notes } =
            subscription_effects("sub_1".into(), "active".into(), Default::default(), unknown)
        else {
            panic!("the status change applies")
        };
        assert_eq!(
            effects,
            vec![Effect::Subscription {
                id: "sub_1".into(),
                status: "active".into(),
                plan: None,
                ends: SubscriptionEnds::default(),
                rank: Rank::of_status("active"),
            }]
        );
        assert_eq!(
            notes,
            vec!["no plan: 'price_legacy' is not in the plan catalog".to_owned()]
        );
    }

    #[test]
    fn status_progression_orders_same_second_states() {
        let order = [
            "incomplete",
            "trialing",
            "active",
            "past_due",
            "unpaid",
            "canceled",
        ];
        for pair in order.windows(2) {
            assert!(
                Rank::of_status(pair[0]) < Rank::of_status(pair[1]),
                "{pair:?}"
            );
        }
        assert!(Rank::REFUTED < Rank::of_status("incomplete"));
        let read_at = chrono::DateTime::from_timestamp(1_773_144_000, 0).unwrap();
        assert!(Rank::of_status("canceled") < Rank::confirmed(read_at));
    }

    #[test]
    fn a_state_confirmed_by_a_later_read_ranks_above_one_confirmed_earlier() {
        let read_at = chrono::DateTime::from_timestamp(1_773_144_000, 0).unwrap();
        let later = read_at + chrono::Duration::microseconds(1);
        assert!(Rank::confirmed(read_at) < Rank::confirmed(later));
    }
}
