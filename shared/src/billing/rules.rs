//! The register rules as plain functions (docs/design.md §4.3): given what a register held
//! before an event's write and what the event asks, whether the write lands and what it did,
//! in words and in the fact an app is told of. [`Registers`] is one account's registers as
//! an event's read found them; the rules apply the event's effects to it, and what they
//! changed is what the event's one statement writes (`inbox::commit`).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};

use super::credits::{pack_grant, pack_refunded, Credits, GrantSnapshot, Transaction};
use super::model::{
    allowance_entry_key, status_entitles, AccountState, Change, Effect, EventContext, Fact,
    PaymentStatus, Rank, StateInputs, SubscriptionEnds, SubscriptionState, Written,
};
use crate::domain::catalog::CreditPack;
use crate::domain::features::{self, Features};
use crate::domain::{Catalog, Period, PlanRef};

/// Where a write sits in one register's order: the provider time as Postgres keeps it (to
/// the microsecond), the rank among same-second states, then the dedupe key compared byte by
/// byte (the `C` collation of the `version_key` columns).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Stamp {
    pub at: DateTime<Utc>,
    pub rank: i64,
    pub key: String,
}

impl Stamp {
    /// The event's stamp at this rank, its time cut to the microsecond as it is stored.
    pub fn of(ctx: &EventContext<'_>, rank: Rank) -> Self {
        let at = ctx.version.at.as_datetime();
        Self {
            at: DateTime::from_timestamp_micros(at.timestamp_micros()).unwrap_or(at),
            rank: rank.0,
            key: ctx.version.key.as_str().to_owned(),
        }
    }
}

/// What a register held before the write: the event that wrote it, at its stamp.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Held<T> {
    pub value: T,
    pub stamp: Stamp,
    pub event_id: i64,
}

impl<T> Held<T> {
    /// Whether the register holds the event `ctx` applies: written by that very row, or by
    /// the thin event that applied it (a thin event's read, applied under the thin event's
    /// id, has the read's version: its own row, applied later, is the same event;
    /// docs/design.md §6.2). A dedupe key is one event of its source.
    pub fn is_of(&self, ctx: &EventContext<'_>) -> bool {
        self.event_id == ctx.event_id || self.stamp.key == ctx.version.key.as_str()
    }

    /// What a register holds once this event's write lands.
    pub fn written(value: T, ctx: &EventContext<'_>, rank: Rank) -> Self {
        Self {
            value,
            stamp: Stamp::of(ctx, rank),
            event_id: ctx.event_id,
        }
    }
}

/// A rule's verdict: whether the write lands, and what it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruled {
    pub writes: bool,
    pub written: Written,
}

impl Ruled {
    fn new(writes: bool, change: Change) -> Self {
        Self {
            writes,
            written: Written::from(change),
        }
    }

    fn made(words: String, fact: Fact) -> Self {
        Self {
            writes: true,
            written: Written {
                change: Change::Made(words),
                fact: Some(fact),
                tied_with: None,
            },
        }
    }
}

/// The last writer wins: a write lands when the register is empty or holds an older stamp.
fn newer<T>(held: Option<&Held<T>>, stamp: &Stamp) -> bool {
    held.is_none_or(|h| h.stamp < *stamp)
}

/// A write that did not land: is it because this very event is what is stored?
fn kept(this_event: bool, what: &str, superseded: &str) -> Change {
    if this_event {
        Change::AlreadyApplied(format!("this {what} is already stored"))
    } else {
        Change::Superseded(superseded.to_owned())
    }
}

/// The customer's plan register (Kinde): `key` is the plan key the event names, `plan` the
/// catalog's name for it.
pub fn customer_plan(
    held: Option<&Held<HeldPlan>>,
    ctx: &EventContext<'_>,
    key: Option<&str>,
    plan: Option<&str>,
) -> Ruled {
    if !newer(held, &Stamp::of(ctx, Rank(0))) {
        let superseded = "a newer plan change is already stored";
        return Ruled::new(
            false,
            kept(
                held.is_some_and(|h| h.is_of(ctx)),
                "plan change",
                superseded,
            ),
        );
    }
    if held.is_some_and(|h| h.value.key.as_deref() == key) {
        return Ruled::new(
            true,
            Change::Unchanged(match key {
                Some(key) => format!("the plan is already '{key}'"),
                None => "the plan is already cancelled".to_owned(),
            }),
        );
    }
    Ruled::new(
        true,
        Change::Made(match (plan, key) {
            (Some(name), _) => format!("plan set to {name}"),
            (None, Some(key)) => format!("plan set to '{key}', which entitles nothing"),
            (None, None) => "plan cancelled".to_owned(),
        }),
    )
}

/// The customer's payment standing register (Kinde).
pub fn standing(held: Option<&Held<bool>>, ctx: &EventContext<'_>, past_due: bool) -> Ruled {
    let words = if past_due {
        "payments past due"
    } else {
        "payments in good standing"
    };
    if !newer(held, &Stamp::of(ctx, Rank(0))) {
        let superseded = "a newer payment standing is already stored";
        return Ruled::new(
            false,
            kept(
                held.is_some_and(|h| h.is_of(ctx)),
                "payment standing",
                superseded,
            ),
        );
    }
    if held.is_some_and(|h| h.value == past_due) {
        return Ruled::new(true, Change::Unchanged(format!("{words} already")));
    }
    Ruled::new(true, Change::Made(words.to_owned()))
}

/// One entitlement register as it holds a provider's grant of features (docs/design.md
/// §4.12): whether the grant is active, and the features it gives.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldEntitlement {
    pub active: bool,
    pub features: Features,
}

impl HeldEntitlement {
    /// The grant in words: "gives sso, seats=20", "gives nothing", "revoked".
    pub fn words(&self) -> String {
        if !self.active {
            return "revoked".to_owned();
        }
        if self.features.is_empty() {
            return "gives nothing".to_owned();
        }
        let named: Vec<String> = self
            .features
            .iter()
            .map(|(key, value)| match value {
                features::FeatureValue::Flag(true) => key.clone(),
                value => format!("{key}={value}"),
            })
            .collect();
        format!("gives {}", named.join(", "))
    }
}

/// An entitlement register: the last writer wins, like the plan register; the register holds
/// what the winning event says of its grant, whole (a summary's set replaces the one before).
/// `rank` orders writes stamped with the same provider time: 0 for an event's own word, a
/// confirmed rank for the provider's, read to settle such a tie (docs/design.md §4.2), so
/// the random event id never decides between two states the provider has spoken on.
pub fn entitlement(
    held: Option<&Held<HeldEntitlement>>,
    ctx: &EventContext<'_>,
    grant: &str,
    (value, rank): (&HeldEntitlement, Rank),
) -> Ruled {
    if !newer(held, &Stamp::of(ctx, rank)) {
        let superseded = format!("a newer state of entitlement {grant} is already stored");
        return Ruled::new(
            false,
            kept(
                held.is_some_and(|h| h.is_of(ctx)),
                "entitlement",
                &superseded,
            ),
        );
    }
    if held.is_some_and(|h| h.value == *value) {
        return Ruled::new(
            true,
            Change::Unchanged(format!("entitlement {grant} {} already", value.words())),
        );
    }
    Ruled::new(
        true,
        Change::Made(format!("entitlement {grant} {}", value.words())),
    )
}

/// The customer's plan as its register holds it: the plan key, and the catalog's name for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldPlan {
    pub key: Option<String>,
    pub plan: Option<String>,
}

/// A subscription as its register holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldSubscription {
    pub customer: String,
    pub status: String,
    pub plan_key: Option<String>,
    pub plan: Option<String>,
    pub ends: SubscriptionEnds,
}

/// A subscription's register: the whole object's state (status, plan, ends), ordered by its
/// stamp at `rank`. The register holds what the winning event says, nulls included, so the
/// ends are the same in every order. Whatever the verdict, it says which other event's
/// state the register held at the same provider time (a tie the rank settled).
pub fn subscription(
    held: Option<&Held<HeldSubscription>>,
    ctx: &EventContext<'_>,
    id: &str,
    (status, plan, ends): (&str, Option<(&str, &str)>, &SubscriptionEnds),
    rank: Rank,
) -> Ruled {
    let stamp = Stamp::of(ctx, rank);
    let tied_with = held
        .filter(|h| h.stamp.at == stamp.at && !h.is_of(ctx))
        .map(|h| h.event_id);
    let mut ruled = if !newer(held, &stamp) {
        let superseded = format!("a newer state of subscription {id} is already stored");
        Ruled::new(
            false,
            kept(
                held.is_some_and(|h| h.is_of(ctx)),
                "subscription state",
                &superseded,
            ),
        )
    } else {
        // No provider moves a subscription between customers, but a payload can name
        // another customer's: it lands (the newest state wins), as new to this customer.
        let from = held
            .filter(|h| h.value.customer != ctx.customer.as_str())
            .map(|h| h.value.customer.as_str());
        let previous = held.filter(|_| from.is_none());
        let same_status = previous.filter(|h| {
            h.value.status == status && h.value.plan_key.as_deref() == plan.map(|p| p.0)
        });
        if same_status.is_some_and(|h| h.value.ends == *ends) {
            let unchanged = format!("subscription {id} is already {status}");
            Ruled::new(true, Change::Unchanged(unchanged))
        } else {
            let fact = Fact::Subscription {
                id: id.to_owned(),
                now: SubscriptionState {
                    status: status.to_owned(),
                    plan: plan.map(|p| p.1.to_owned()),
                    ends: ends.clone(),
                },
                previous: previous.map(|h| SubscriptionState {
                    status: h.value.status.clone(),
                    plan: h.value.plan.clone(),
                    ends: h.value.ends.clone(),
                }),
            };
            let words = match (from, same_status) {
                (Some(from), _) => {
                    format!("subscription {id} is {status}; it was held under customer {from}")
                }
                // Only its ends moved: a cancellation scheduled or withdrawn, a new period.
                (None, Some(h)) => format!(
                    "subscription {id} is {status}; {}",
                    ends.changes_from(&h.value.ends)
                ),
                (None, None) => format!("subscription {id} is {status}"),
            };
            Ruled::made(words, fact)
        }
    };
    ruled.written.tied_with = tied_with;
    ruled
}

/// A payment's register. Refunded is terminal: nothing moves a refunded payment, and a
/// refund moves any other state whatever its time, so the end state does not depend on the
/// order. Of a failure and a payment in the same second, paid is the later state.
/// A payment as its register holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldPayment {
    pub status: String,
    pub plan_key: Option<String>,
}

pub fn payment(
    held: Option<&Held<HeldPayment>>,
    ctx: &EventContext<'_>,
    id: &str,
    status: PaymentStatus,
) -> Ruled {
    let refunded = PaymentStatus::Refunded.as_str();
    let writes = match held {
        None => true,
        Some(h) if h.value.status == refunded => false,
        Some(_) if status == PaymentStatus::Refunded => true,
        Some(h) => h.stamp < Stamp::of(ctx, Rank::of_payment(status)),
    };
    let stored = held.map(|h| h.value.status.as_str());
    let name = status.as_str();
    if writes && stored == Some(name) {
        return Ruled::new(
            true,
            Change::Unchanged(format!("payment {id} is already {name}")),
        );
    }
    if writes {
        let fact = Fact::Payment {
            id: id.to_owned(),
            status,
            previous: stored.map(str::to_owned),
        };
        return Ruled::made(format!("payment {id} is {name}"), fact);
    }
    let superseded = if stored == Some(refunded) {
        format!("payment {id} is refunded, which is final")
    } else {
        format!("a newer state of payment {id} is already stored")
    };
    Ruled::new(
        false,
        kept(
            held.is_some_and(|h| h.is_of(ctx)),
            "payment state",
            &superseded,
        ),
    )
}

/// What the ledger held for the event's period before a grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPeriod {
    /// The largest allowance granted in the period, if any was.
    pub largest: Option<i64>,
    /// The event that wrote this grant's entry (account, period and plan), if one did.
    pub granted_by: Option<i64>,
    /// Whether the customer is deleted (its balance shows 0).
    pub deleted: bool,
}

/// A grant of a plan's allowance for the event's period, once per account, period and plan.
/// It tops the period up to the largest allowance granted in it: its delta is what it adds.
/// Returns the delta the entry is written with, when it is.
pub fn grant(
    held: &HeldPeriod,
    ctx: &EventContext<'_>,
    plan: &str,
    allowance: i64,
    entry_key: &str,
) -> (Ruled, Option<i64>) {
    let period = Period::of(ctx.version.at);
    if held.granted_by.is_some() {
        let superseded = format!("the {plan} allowance for {period} is already granted");
        let kept = kept(held.granted_by == Some(ctx.event_id), "grant", &superseded);
        return (Ruled::new(false, kept), None);
    }
    let delta = (allowance - held.largest.unwrap_or(0)).max(0);
    if delta == 0 {
        let words = format!("the {period} balance already holds {plan}'s allowance or more");
        return (Ruled::new(true, Change::Superseded(words)), Some(0));
    }
    let shown = match held.deleted {
        true => " (the customer is deleted: its balance shows 0)",
        false => "",
    };
    let fact = Fact::Granted {
        plan: plan.to_owned(),
        period: period.clone(),
        amount: delta,
        entry_key: entry_key.to_owned(),
    };
    let words = format!("granted {delta} for {plan} in {period}{shown}");
    (Ruled::made(words, fact), Some(delta))
}

/// The customer's tombstone: the earliest deletion is kept, and it never lifts.
pub fn delete_customer(deleted_at: Option<DateTime<Utc>>, ctx: &EventContext<'_>) -> Ruled {
    let at = Stamp::of(ctx, Rank(0)).at;
    if deleted_at.is_none_or(|d| d > at) {
        return Ruled::made("customer deleted".to_owned(), Fact::Deleted);
    }
    Ruled::new(
        false,
        Change::AlreadyApplied("the customer is already deleted".to_owned()),
    )
}

/// The account row: its version, which every event's write moves (so a write finds out
/// whether the account moved since it was read), and its tombstone.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldAccount {
    /// `None`: the account did not exist when it was read.
    pub version: Option<i64>,
    pub deleted_at: Option<DateTime<Utc>>,
    /// The event whose deletion is kept (the earliest).
    pub deleted_by: Option<i64>,
}

/// What the payment-intent register knows of one intent: the invoice it paid, its
/// customer, and a full refund received for its charge.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldIntent {
    pub invoice: Option<String>,
    pub customer: Option<String>,
    pub refunded_charge: Option<String>,
    pub refunded_by: Option<i64>,
    /// The event that told the invoice.
    pub linked_by: Option<i64>,
}

/// One entry of the ledger in the event's period.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LedgerEntry {
    pub plan: String,
    pub allowance: i64,
    pub delta: i64,
    pub entry_key: String,
    pub event_id: i64,
}

/// A grant an event adds to the ledger, with its words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewGrant {
    pub entry: LedgerEntry,
    pub reason: String,
}

/// What an event's effects changed: the rows its one statement writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    pub customer_plan: bool,
    pub standing: bool,
    /// The subscriptions and payments written, each with the event that held it when read
    /// (`None`: no row): another customer's event may write the same row, so the write
    /// lands only if the row still holds what was read.
    pub subscriptions: BTreeMap<String, Option<i64>>,
    pub payments: BTreeMap<String, Option<i64>>,
    pub intents: BTreeSet<String>,
    pub grants: Vec<NewGrant>,
    pub deleted: bool,
    /// The entitlement registers written (by grant id), each with the event that held it
    /// when read.
    pub entitlements: BTreeMap<String, Option<i64>>,
    /// The credit grant registers written (by grant id), each whole.
    pub credit_grants: BTreeSet<String>,
    /// The credit transactions counted now (each once by its id).
    pub credit_transactions: Vec<Transaction>,
}

impl Changed {
    /// Whether the account's credits moved: what they tell is told again (docs/design.md
    /// §4.14).
    pub fn credits(&self) -> bool {
        !self.credit_grants.is_empty() || !self.credit_transactions.is_empty()
    }
}

/// The events a credit grant's row names (docs/design.md §3.9): its latest snapshot's, and
/// the one that said its earliest void.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrantRow {
    pub event_id: i64,
    pub voided_by: Option<i64>,
}

/// One account's registers as an event's read found them — the account row, its plan and
/// standing, the subscriptions, payments and payment intents the event names, the states of
/// the account's other subscriptions (for its derived plan, with effects on), its ledger in
/// the event's period — and, once the event's effects are applied, as they leave them.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Registers {
    pub account: HeldAccount,
    pub customer_plan: Option<Held<HeldPlan>>,
    pub standing: Option<Held<bool>>,
    pub subscriptions: BTreeMap<String, Held<HeldSubscription>>,
    /// The distinct states (status, plan) of the account's other subscriptions, when read.
    pub other_subscriptions: Vec<(String, Option<String>)>,
    pub payments: BTreeMap<String, Held<HeldPayment>>,
    pub intents: BTreeMap<String, HeldIntent>,
    pub ledger: Vec<LedgerEntry>,
    /// The account's entitlement registers, every one (an account holds few), by grant id.
    pub entitlements: BTreeMap<String, Held<HeldEntitlement>>,
    /// The account's credit grants and their transactions (docs/design.md §4.14), read when
    /// the event touches credits or a payment (a refund voids the packs it bought), with the
    /// transactions of the grants the event names (kept before their grant came).
    #[serde(skip)]
    pub credits: Credits,
    /// Per grant, the events its row names.
    #[serde(skip)]
    pub credit_rows: BTreeMap<String, GrantRow>,
    /// The account's accepted debits and its periods' allowances, read with its credits
    /// when it has a grant: their derived allocations count in what the credits tell.
    #[serde(skip)]
    pub spends: super::credits::Spends,
    /// What the account's accepted debits spent in the event's period, as read (debits
    /// do not move the account's version: the effects' `account` block tells it as read).
    pub used: i64,
    #[serde(skip)]
    pub changed: Changed,
}

/// What the provider showed of an invoice's subscription when its register held none of the
/// subscriptions the invoice names (docs/design.md §6.2).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SubscriptionRead {
    /// No read was needed, or none was made.
    #[default]
    NotRead,
    /// The source has no API key to read the subscription with.
    NoApiKey,
    /// The provider does not know the subscription (404).
    Unknown(String),
    /// The read, stored as event `event_id`.
    Read(ShownSubscription),
}

/// A subscription as a provider read showed it: its customer (the account's id, as an event
/// about it names it) and the plan the catalog knows it by, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownSubscription {
    pub id: String,
    pub customer: String,
    pub plan: Option<PlanRef>,
    pub event_id: i64,
}

impl Registers {
    /// Resolves each [`Effect::GrantOfSubscription`] against the subscriptions as read: the
    /// first subscription the invoice names that the register holds for this customer with a
    /// plan the catalog knows gives the grant, and the payment the invoice is takes its plan
    /// key. When the register holds none of them, the provider's read of one (`read`: stored
    /// as an event of its own, docs/design.md §6.2) gives it, when it is this customer's and
    /// names a known plan. When neither does, the payment stands without an allowance and the
    /// note says which paths were read, what the register held and what the provider showed.
    /// Returns the effects to apply, the notes, and whether a payment was left without a plan.
    pub fn plan_of_subscription(
        &self,
        ctx: &EventContext<'_>,
        effects: &[Effect],
        catalog: &Catalog,
        read: &SubscriptionRead,
    ) -> (Vec<Effect>, Vec<String>, bool) {
        let mut out = Vec::with_capacity(effects.len());
        let mut notes = Vec::new();
        let mut ungranted = false;
        for effect in effects {
            let Effect::GrantOfSubscription {
                payment,
                subscriptions,
                read: paths,
            } = effect
            else {
                out.push(effect.clone());
                continue;
            };
            let held = subscriptions.iter().find_map(|id| {
                let held = self.subscriptions.get(id.as_str())?;
                let key = held.value.plan_key.as_deref()?;
                let plan = catalog.resolve(&[key]).ok().flatten()?;
                (held.value.customer == ctx.customer.as_str()).then_some((id, plan, None))
            });
            let held_none = subscriptions
                .iter()
                .all(|id| !self.subscriptions.contains_key(id.as_str()));
            let provider = match (&held, read) {
                (None, SubscriptionRead::Read(shown)) if held_none => shown
                    .plan
                    .clone()
                    .filter(|_| shown.customer == ctx.customer.as_str())
                    .map(|plan| (&shown.id, plan, Some(shown.event_id))),
                _ => None,
            };
            match held.or(provider) {
                Some((id, plan, read_event)) => {
                    for effect in out.iter_mut() {
                        if let Effect::Payment {
                            id: paid,
                            status: PaymentStatus::Paid,
                            plan_key,
                        } = effect
                        {
                            if paid == payment {
                                *plan_key = Some(plan.key.clone());
                            }
                        }
                    }
                    let from = match read_event {
                        None => String::new(),
                        Some(event) => format!(" as the provider shows it (read, event {event})"),
                    };
                    notes.push(format!(
                        "plan {} from subscription {id}{from} ({}): the lines name no known price",
                        plan.plan, plan.key
                    ));
                    out.push(Effect::Grant { plan });
                }
                None => {
                    ungranted = true;
                    let register = match subscriptions.as_slice() {
                        [] => "the invoice names no subscription".to_owned(),
                        ids => format!(
                            "the subscription register holds no known plan for {}",
                            ids.join(", ")
                        ),
                    };
                    let provider = match read {
                        _ if subscriptions.is_empty() || !held_none => String::new(),
                        SubscriptionRead::NotRead => String::new(),
                        SubscriptionRead::NoApiKey => {
                            "; the source has no API key to read it from the provider".to_owned()
                        }
                        SubscriptionRead::Unknown(id) => {
                            format!("; the provider does not know {id}")
                        }
                        SubscriptionRead::Read(shown)
                            if shown.customer != ctx.customer.as_str() =>
                        {
                            format!(
                                "; the provider shows {} as {}'s (read, event {})",
                                shown.id, shown.customer, shown.event_id
                            )
                        }
                        SubscriptionRead::Read(shown) => format!(
                            "; the provider shows {} with no known plan (read, event {})",
                            shown.id, shown.event_id
                        ),
                    };
                    notes.push(format!(
                        "no allowance granted: read {paths}; {register}{provider}"
                    ));
                }
            }
        }
        (out, notes, ungranted)
    }

    /// Applies one effect under its register's rule and says what it did.
    pub fn apply(&mut self, ctx: &EventContext<'_>, effect: &Effect) -> Written {
        match effect {
            Effect::CustomerPlan { plan, key } => {
                let name = plan.as_ref().map(|p| p.plan.clone());
                let ruled = customer_plan(
                    self.customer_plan.as_ref(),
                    ctx,
                    key.as_deref(),
                    name.as_deref(),
                );
                if ruled.writes {
                    let value = HeldPlan {
                        key: key.clone(),
                        plan: name,
                    };
                    self.customer_plan = Some(Held::written(value, ctx, Rank(0)));
                    self.changed.customer_plan = true;
                }
                ruled.written
            }
            Effect::Standing { past_due } => {
                let ruled = standing(self.standing.as_ref(), ctx, *past_due);
                if ruled.writes {
                    self.standing = Some(Held::written(*past_due, ctx, Rank(0)));
                    self.changed.standing = true;
                }
                ruled.written
            }
            Effect::Subscription {
                id,
                status,
                plan,
                ends,
                rank,
            } => {
                let plan = plan.as_ref().map(|p| (p.key.as_str(), p.plan.as_str()));
                let state = (status.as_str(), plan, ends);
                let ruled = subscription(self.subscriptions.get(id), ctx, id, state, *rank);
                if ruled.writes {
                    let value = HeldSubscription {
                        customer: ctx.customer.as_str().to_owned(),
                        status: status.clone(),
                        plan_key: plan.map(|p| p.0.to_owned()),
                        plan: plan.map(|p| p.1.to_owned()),
                        ends: ends.clone(),
                    };
                    let held = Held::written(value, ctx, *rank);
                    let read = self.subscriptions.insert(id.clone(), held);
                    self.changed
                        .subscriptions
                        .entry(id.clone())
                        .or_insert(read.map(|r| r.event_id));
                }
                ruled.written
            }
            Effect::Payment {
                id,
                status,
                plan_key,
            } => self.payment(ctx, id, *status, plan_key.as_deref()),
            Effect::Grant { plan } => self.grant(ctx, &plan.plan, plan.monthly_allowance),
            // Turned into a grant, or into nothing, by `plan_of_subscription` before the
            // rules run; one left over grants nothing and says so.
            Effect::GrantOfSubscription { payment, .. } => Change::Unchanged(format!(
                "no allowance granted for {payment}: its subscription's plan was not resolved"
            ))
            .into(),
            Effect::DeleteCustomer => {
                let ruled = delete_customer(self.account.deleted_at, ctx);
                if ruled.writes {
                    self.account.deleted_at = Some(Stamp::of(ctx, Rank(0)).at);
                    self.account.deleted_by = Some(ctx.event_id);
                    self.changed.deleted = true;
                }
                ruled.written
            }
            Effect::Entitlement {
                grant,
                active,
                features,
                rank,
            } => {
                let value = HeldEntitlement {
                    active: *active,
                    features: features.clone(),
                };
                let ruled = entitlement(self.entitlements.get(grant), ctx, grant, (&value, *rank));
                if ruled.writes {
                    let held = Held::written(value, ctx, *rank);
                    let read = self.entitlements.insert(grant.clone(), held);
                    self.changed
                        .entitlements
                        .entry(grant.clone())
                        .or_insert(read.map(|r| r.event_id));
                }
                ruled.written
            }
            Effect::CreditGrant(snapshot) => self.credit_grant(ctx, snapshot.clone()),
            Effect::CreditTransaction(t) => self.credit_transaction(t),
            Effect::PackBought {
                payment,
                price,
                pack,
                quantity,
            } => {
                let pack = CreditPack {
                    amount: pack.amount.saturating_mul(i64::from(*quantity)),
                    ..pack.clone()
                };
                let stamp = Stamp::of(ctx, Rank(0));
                let bought = pack_grant(&pack, price, payment, stamp.at.timestamp(), &stamp.key);
                // A payment refunded before its pack was minted (the refund came first): the
                // pack is minted voided at the refund's time, the register the refund would
                // have left had it come second.
                let refunded = self
                    .payments
                    .get(payment)
                    .filter(|held| held.value.status == PaymentStatus::Refunded.as_str());
                match refunded {
                    Some(held) => {
                        let at = held.stamp.at.timestamp();
                        let (key, by) = (held.stamp.key.clone(), held.event_id);
                        self.credit_grant_by(ctx, pack_refunded(&bought, at, &key), Some(by))
                    }
                    None => self.credit_grant(ctx, bought),
                }
            }
            Effect::PaymentIntent {
                payment_intent,
                invoice,
            } => {
                let intent = self.intents.entry(payment_intent.clone()).or_default();
                let learned = intent.invoice.is_none();
                let before = intent.clone();
                if intent.invoice.is_none() {
                    intent.invoice = Some(invoice.clone());
                    intent.linked_by = Some(ctx.event_id);
                }
                intent
                    .customer
                    .get_or_insert_with(|| ctx.customer.as_str().to_owned());
                if *intent != before {
                    self.changed.intents.insert(payment_intent.clone());
                }
                self.refund_if_linked(ctx, payment_intent, learned)
            }
            Effect::RefundIntent {
                charge,
                payment_intent,
            } => {
                let intent = self.intents.entry(payment_intent.clone()).or_default();
                let learned = intent.refunded_by.is_none();
                let before = intent.clone();
                intent
                    .customer
                    .get_or_insert_with(|| ctx.customer.as_str().to_owned());
                intent.refunded_charge.get_or_insert_with(|| charge.clone());
                intent.refunded_by.get_or_insert(ctx.event_id);
                if *intent != before {
                    self.changed.intents.insert(payment_intent.clone());
                }
                self.refund_if_linked(ctx, payment_intent, learned)
            }
        }
    }

    fn payment(
        &mut self,
        ctx: &EventContext<'_>,
        id: &str,
        status: PaymentStatus,
        plan_key: Option<&str>,
    ) -> Written {
        let held = self.payments.get(id);
        let ruled = payment(held, ctx, id, status);
        if ruled.writes {
            // The register holds what its winning event says and nothing of the one before:
            // a plan carried over from a paid event would be kept when the refund came after
            // it and missing when it came first.
            let value = HeldPayment {
                status: status.as_str().to_owned(),
                plan_key: plan_key.map(str::to_owned),
            };
            let held = Held::written(value, ctx, Rank::of_payment(status));
            let read = self.payments.insert(id.to_owned(), held);
            self.changed
                .payments
                .entry(id.to_owned())
                .or_insert(read.map(|r| r.event_id));
            if status == PaymentStatus::Refunded {
                self.void_packs(ctx, id);
            }
        }
        ruled.written
    }

    /// A refund of a payment voids the credit packs it bought, at the refund's time: what
    /// remains of each is taken (docs/design.md §4.14).
    fn void_packs(&mut self, ctx: &EventContext<'_>, payment: &str) {
        let prefix = format!("pack:{payment}:");
        let bought: Vec<GrantSnapshot> = self
            .credits
            .registers()
            .filter(|r| r.latest.grant_id.starts_with(&prefix))
            .map(|r| r.latest.clone())
            .collect();
        let stamp = Stamp::of(ctx, Rank(0));
        for grant in bought {
            let voided = pack_refunded(&grant, stamp.at.timestamp(), &stamp.key);
            self.credit_grant(ctx, voided);
        }
    }

    /// A credit grant's snapshot, under its register's rule (latest by `updated` then key;
    /// the earliest void kept): written when the register moved.
    fn credit_grant(&mut self, ctx: &EventContext<'_>, snapshot: GrantSnapshot) -> Written {
        self.credit_grant_by(ctx, snapshot, None)
    }

    /// As [`Self::credit_grant`]; `said_by`: the event the snapshot stands for, when another
    /// than this one (a refund that came before its payment: the pack as the refund leaves it).
    fn credit_grant_by(
        &mut self,
        ctx: &EventContext<'_>,
        snapshot: GrantSnapshot,
        said_by: Option<i64>,
    ) -> Written {
        let by = said_by.unwrap_or(ctx.event_id);
        let id = snapshot.grant_id.clone();
        let words = snapshot.words();
        let before = self.credits.register(&id).cloned();
        self.credits.grant(snapshot.clone());
        let after = self.credits.register(&id).cloned();
        if before == after {
            let this = before
                .as_ref()
                .is_some_and(|b| b.latest.event_key == snapshot.event_key);
            let superseded = format!("a newer snapshot of credit grant {id} is already stored");
            return kept(this, "credit grant snapshot", &superseded).into();
        }
        let row = self.credit_rows.entry(id.clone()).or_insert(GrantRow {
            event_id: by,
            voided_by: None,
        });
        if before.as_ref().map(|b| &b.latest) != after.as_ref().map(|a| &a.latest) {
            row.event_id = by;
        }
        if before.as_ref().and_then(|b| b.voided_at) != after.as_ref().and_then(|a| a.voided_at) {
            row.voided_by = Some(by);
        }
        self.changed.credit_grants.insert(id);
        Change::Made(words).into()
    }

    /// A credit transaction, counted once by its id; never clamped (docs/design.md §4.14).
    fn credit_transaction(&mut self, t: &Transaction) -> Written {
        let words = format!(
            "credit balance transaction {} of grant {}: {} {}",
            t.transaction_id,
            t.grant_id,
            t.kind.as_str(),
            t.amount
        );
        if self.credits.counts(&t.transaction_id) {
            return Change::AlreadyApplied(format!("{words} is already counted")).into();
        }
        self.credits.transaction(t.clone());
        self.changed.credit_transactions.push(t.clone());
        Change::Made(words).into()
    }

    fn grant(&mut self, ctx: &EventContext<'_>, plan: &str, allowance: i64) -> Written {
        let period = Period::of(ctx.version.at);
        let entry_key = allowance_entry_key(ctx.source, ctx.customer, &period, plan);
        let held = HeldPeriod {
            largest: self.ledger.iter().map(|e| e.allowance).max(),
            granted_by: self
                .ledger
                .iter()
                .find(|e| e.entry_key == entry_key)
                .map(|e| e.event_id),
            deleted: self.account.deleted_at.is_some(),
        };
        let (ruled, delta) = grant(&held, ctx, plan, allowance, &entry_key);
        if let Some(delta) = delta {
            let entry = LedgerEntry {
                plan: plan.to_owned(),
                allowance,
                delta,
                entry_key,
                event_id: ctx.event_id,
            };
            self.ledger.push(entry.clone());
            let reason = format!("{plan} allowance for {period} ({})", ctx.event_type);
            self.changed.grants.push(NewGrant { entry, reason });
        }
        ruled.written
    }

    /// What a link or a refund of a payment intent does once both halves may be known: the
    /// invoice is refunded when the link and a full refund are both recorded, whichever came
    /// first. `learned`: whether this effect added what it carried to the register.
    fn refund_if_linked(
        &mut self,
        ctx: &EventContext<'_>,
        payment_intent: &str,
        learned: bool,
    ) -> Written {
        let intent = self
            .intents
            .get(payment_intent)
            .cloned()
            .unwrap_or_default();
        let change = match (intent.invoice, intent.refunded_by) {
            (Some(invoice), Some(_)) => {
                let written = self.payment(ctx, &invoice, PaymentStatus::Refunded, None);
                return match written.change {
                    Change::Made(words) => Written {
                        change: Change::Made(format!(
                            "{words} (a full refund of {payment_intent})"
                        )),
                        ..written
                    },
                    _ => written,
                };
            }
            (Some(invoice), None) if learned => {
                Change::Made(format!("payment intent {payment_intent} paid {invoice}"))
            }
            (Some(invoice), None) => Change::AlreadyApplied(format!(
                "payment intent {payment_intent} is already known to have paid {invoice}"
            )),
            (None, _) if learned => Change::Made(format!(
                "refund of {payment_intent} recorded; it could not be linked to an invoice yet"
            )),
            (None, _) => Change::AlreadyApplied(format!(
                "the refund of {payment_intent} is already recorded"
            )),
        };
        Written::from(change)
    }

    /// The join of the features of the account's active entitlement registers.
    pub fn entitled_features(&self) -> Features {
        let mut out = Features::new();
        for held in self.entitlements.values().filter(|h| h.value.active) {
            features::join(&mut out, &held.value.features);
        }
        out
    }

    /// The account as an effect tells it: the derived plan and the period's balance (read
    /// with the account's other subscriptions). An account that does not exist is on the
    /// free plan with nothing.
    pub fn state(&self, customer: &str, period: &Period, catalog: &Catalog) -> AccountState {
        let entitled = self.entitled_features();
        let inputs = StateInputs {
            deleted: self.account.deleted_at.is_some(),
            customer_plan: self
                .customer_plan
                .as_ref()
                .and_then(|p| p.value.plan.as_deref()),
            past_due: self.standing.as_ref().is_some_and(|s| s.value),
            granted: self.ledger.iter().map(|e| e.delta).sum(),
            used: self.used,
            entitlements: &entitled,
        };
        let entitling = self
            .subscriptions
            .values()
            .map(|s| &s.value)
            .filter(|s| s.customer == customer)
            .map(|s| (s.status.as_str(), s.plan.as_deref()))
            .chain(
                self.other_subscriptions
                    .iter()
                    .map(|(status, plan)| (status.as_str(), plan.as_deref())),
            )
            .filter(|(status, _)| status_entitles(status))
            .filter_map(|(_, plan)| plan);
        AccountState::derive(inputs, entitling, period, catalog)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::Version;
    use crate::domain::{CustomerId, DedupeKey, ProviderTime};

    fn ctx<'a>(customer: &'a CustomerId, event_id: i64, secs: i64, key: &str) -> EventContext<'a> {
        EventContext {
            event_id,
            source: "stripe",
            customer,
            event_type: "customer.subscription.updated",
            dedupe_key: Box::leak(Box::new(DedupeKey::parse(key).unwrap())),
            version: Version {
                at: ProviderTime::from_unix_secs(secs).unwrap(),
                key: DedupeKey::parse(key).unwrap(),
            },
        }
    }

    fn held<T>(value: T, event_id: i64, secs: i64, rank: i64, key: &str) -> Held<T> {
        Held {
            value,
            stamp: Stamp {
                at: DateTime::from_timestamp(secs, 0).unwrap(),
                rank,
                key: key.to_owned(),
            },
            event_id,
        }
    }

    fn sub(status: &str, plan: Option<&str>) -> HeldSubscription {
        HeldSubscription {
            customer: "cus_1".to_owned(),
            status: status.to_owned(),
            plan_key: plan.map(str::to_owned),
            plan: plan.map(str::to_owned),
            ends: SubscriptionEnds::default(),
        }
    }

    const NO_ENDS: &SubscriptionEnds = &SubscriptionEnds {
        current_period_end: None,
        cancel_at_period_end: false,
        cancel_at: None,
        trial_end: None,
        ended_at: None,
    };

    fn paid_as(status: &str) -> HeldPayment {
        HeldPayment {
            status: status.to_owned(),
            plan_key: None,
        }
    }

    /// `customer`'s event 2 at 200 s makes sub_1 active on pro, over `held` (event 1, 100 s).
    fn activate(held: &Held<HeldSubscription>, customer: &str) -> Ruled {
        let c = CustomerId::parse(customer).unwrap();
        subscription(
            Some(held),
            &ctx(&c, 2, 200, "evt_b"),
            "sub_1",
            ("active", Some(("pro", "pro")), NO_ENDS),
            Rank(3),
        )
    }

    /// The words and the previous state of a subscription write that landed.
    fn made(ruled: Ruled) -> (Change, Option<SubscriptionState>) {
        assert!(ruled.writes);
        let Some(Fact::Subscription { previous, .. }) = ruled.written.fact else {
            panic!("a subscription fact");
        };
        (ruled.written.change, previous)
    }

    #[test]
    fn a_later_subscription_state_lands_and_tells_the_previous_one() {
        let ruled = activate(
            &held(sub("trialing", Some("pro")), 1, 100, 2, "evt_a"),
            "cus_1",
        );
        assert_eq!(ruled.written.tied_with, None);
        let (change, previous) = made(ruled);
        assert_eq!(change, Change::Made("subscription sub_1 is active".into()));
        assert_eq!(previous.unwrap().status, "trialing");
    }

    #[test]
    fn a_newer_state_of_another_customers_subscription_lands_and_says_so() {
        let ruled = activate(
            &held(sub("active", Some("pro")), 1, 100, 3, "evt_a"),
            "cus_2",
        );
        let (change, previous) = made(ruled);
        let words = "subscription sub_1 is active; it was held under customer cus_1";
        assert_eq!(change, Change::Made(words.into()));
        assert_eq!(previous, None, "new to this customer");
    }

    #[test]
    fn an_older_subscription_state_is_superseded_and_a_replay_is_already_applied() {
        let c = CustomerId::parse("cus_1").unwrap();
        let held = held(sub("canceled", None), 7, 300, 7, "evt_z");
        let late = subscription(
            Some(&held),
            &ctx(&c, 2, 200, "evt_b"),
            "sub_1",
            ("active", None, NO_ENDS),
            Rank(3),
        );
        assert!(!late.writes);
        assert!(matches!(late.written.change, Change::Superseded(_)));
        let replay = subscription(
            Some(&held),
            &ctx(&c, 7, 300, "evt_z"),
            "sub_1",
            ("canceled", None, NO_ENDS),
            Rank(7),
        );
        assert!(!replay.writes);
        assert_eq!(
            replay.written.change,
            Change::AlreadyApplied("this subscription state is already stored".into())
        );
    }

    #[test]
    fn a_thin_events_read_applied_by_itself_later_finds_its_work_done() {
        // The thin event (event 5) applied its read `read:evt_t` under its own id; the read's
        // own row (event 15), left pending and sent by the rescue, is the same version: no
        // tie, nothing newer, its work is done (docs/design.md §6.2).
        let c = CustomerId::parse("cus_1").unwrap();
        let held = held(sub("active", None), 5, 300, 3, "read:evt_t");
        let again = subscription(
            Some(&held),
            &ctx(&c, 15, 300, "read:evt_t"),
            "sub_1",
            ("active", None, NO_ENDS),
            Rank(3),
        );
        assert!(!again.writes);
        assert_eq!(again.written.tied_with, None);
        assert_eq!(
            again.written.change,
            Change::AlreadyApplied("this subscription state is already stored".into())
        );
    }

    #[test]
    fn a_same_second_state_is_ordered_by_rank_then_key_and_names_the_tie() {
        let c = CustomerId::parse("cus_1").unwrap();
        let held = held(sub("active", None), 4, 100, 3, "evt_m");
        let canceled = subscription(
            Some(&held),
            &ctx(&c, 5, 100, "evt_a"),
            "sub_1",
            ("canceled", None, NO_ENDS),
            Rank(7),
        );
        assert!(canceled.writes, "a higher rank wins whatever the key");
        assert_eq!(canceled.written.tied_with, Some(4));
        let trialing = subscription(
            Some(&held),
            &ctx(&c, 5, 100, "evt_z"),
            "sub_1",
            ("trialing", None, NO_ENDS),
            Rank(2),
        );
        assert!(!trialing.writes, "a lower rank loses whatever the key");
        let same_rank = subscription(
            Some(&held),
            &ctx(&c, 5, 100, "evt_n"),
            "sub_1",
            ("active", None, NO_ENDS),
            Rank(3),
        );
        assert!(same_rank.writes, "then the key decides, byte by byte");
        assert!(matches!(same_rank.written.change, Change::Unchanged(_)));
        let upper = subscription(
            Some(&held),
            &ctx(&c, 5, 100, "evt_Z"),
            "sub_1",
            ("active", None, NO_ENDS),
            Rank(3),
        );
        assert!(!upper.writes, "'Z' sorts before 'm' in byte order");
    }

    #[test]
    fn a_cancellation_scheduled_or_withdrawn_is_a_change_and_a_same_state_is_not() {
        let c = CustomerId::parse("cus_1").unwrap();
        let period_end = DateTime::from_timestamp(1_767_225_600, 0);
        let running = SubscriptionEnds {
            current_period_end: period_end,
            ..SubscriptionEnds::default()
        };
        let scheduled = SubscriptionEnds {
            cancel_at_period_end: true,
            ..running.clone()
        };
        let mut held = held(sub("active", Some("pro")), 1, 100, 3, "evt_a");
        held.value.ends = running.clone();
        let write = |held: &Held<HeldSubscription>, ends: &SubscriptionEnds| {
            subscription(
                Some(held),
                &ctx(&c, 2, 200, "evt_b"),
                "sub_1",
                ("active", Some(("pro", "pro")), ends),
                Rank(3),
            )
        };
        let ruled = write(&held, &scheduled);
        let Some(Fact::Subscription { now, previous, .. }) = ruled.written.fact.clone() else {
            panic!("a subscription fact");
        };
        assert_eq!(
            ruled.written.change,
            Change::Made("subscription sub_1 is active; cancels at period end".into())
        );
        assert_eq!(now.ends, scheduled);
        assert_eq!(
            previous.unwrap().ends,
            running,
            "the previous ends are told"
        );
        let same = write(&held, &running);
        assert!(same.writes, "the version moves");
        assert_eq!(
            same.written.change,
            Change::Unchanged("subscription sub_1 is already active".into())
        );
        held.value.ends = scheduled;
        assert_eq!(
            write(&held, &running).written.change,
            Change::Made("subscription sub_1 is active; no longer cancels at period end".into())
        );
    }

    #[test]
    fn a_refunded_payment_is_final_and_a_refund_wins_whatever_its_time() {
        let c = CustomerId::parse("cus_1").unwrap();
        let paid = held(paid_as("paid"), 1, 500, 2, "evt_p");
        let refund = payment(
            Some(&paid),
            &ctx(&c, 2, 100, "evt_r"),
            "in_1",
            PaymentStatus::Refunded,
        );
        assert!(refund.writes);
        let Some(Fact::Payment { previous, .. }) = refund.written.fact else {
            panic!("a payment fact");
        };
        assert_eq!(previous.as_deref(), Some("paid"));
        let refunded = held(paid_as("refunded"), 2, 100, 3, "evt_r");
        let late_paid = payment(
            Some(&refunded),
            &ctx(&c, 3, 900, "evt_q"),
            "in_1",
            PaymentStatus::Paid,
        );
        assert!(!late_paid.writes);
        assert_eq!(
            late_paid.written.change,
            Change::Superseded("payment in_1 is refunded, which is final".into())
        );
    }

    #[test]
    fn a_grant_tops_the_period_up_to_its_largest_allowance() {
        let c = CustomerId::parse("cus_1").unwrap();
        let ctx = ctx(&c, 9, 1_700_000_000, "evt_g");
        let period = HeldPeriod {
            largest: Some(10),
            granted_by: None,
            deleted: false,
        };
        let (ruled, delta) = grant(&period, &ctx, "pro", 500, "k");
        assert_eq!((ruled.writes, delta), (true, Some(490)));
        let covered = HeldPeriod {
            largest: Some(2000),
            ..period.clone()
        };
        let (ruled, delta) = grant(&covered, &ctx, "pro", 500, "k");
        assert_eq!((ruled.writes, delta), (true, Some(0)));
        assert!(matches!(ruled.written.change, Change::Superseded(_)));
        let again = HeldPeriod {
            granted_by: Some(9),
            ..period
        };
        let (ruled, delta) = grant(&again, &ctx, "pro", 500, "k");
        assert_eq!((ruled.writes, delta), (false, None));
        assert!(matches!(ruled.written.change, Change::AlreadyApplied(_)));
    }

    #[test]
    fn the_earliest_deletion_is_the_tombstone() {
        let c = CustomerId::parse("cus_1").unwrap();
        let ctx = ctx(&c, 3, 200, "evt_d");
        assert!(delete_customer(None, &ctx).writes);
        assert!(delete_customer(DateTime::from_timestamp(300, 0), &ctx).writes);
        assert!(!delete_customer(DateTime::from_timestamp(100, 0), &ctx).writes);
        assert!(!delete_customer(DateTime::from_timestamp(200, 0), &ctx).writes);
    }

    #[test]
    fn a_stamp_keeps_the_microseconds_postgres_keeps() {
        let c = CustomerId::parse("cus_1").unwrap();
        let mut ctx = ctx(&c, 1, 0, "evt_a");
        let at = DateTime::from_timestamp(1_700_000_000, 123_456_789).unwrap();
        ctx.version.at = ProviderTime::from(at);
        let stamp = Stamp::of(&ctx, Rank(0));
        assert_eq!(stamp.at.timestamp_subsec_nanos(), 123_456_000);
    }

    /// An invoice that names no known price takes the plan its subscription's register holds
    /// for the same customer; another customer's subscription, a register without a plan the
    /// catalog knows, or none at all leave the payment without an allowance, and say so.
    #[test]
    fn an_invoice_takes_its_subscriptions_plan_from_the_register() {
        let catalog = Catalog::parse(r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#).unwrap();
        let customer = CustomerId::parse("cus_1").unwrap();
        let ctx = ctx(&customer, 9, 1_767_225_601, "evt_9");
        let effects = |subscriptions: &[&str]| {
            vec![
                Effect::Payment {
                    id: "in_1".into(),
                    status: PaymentStatus::Paid,
                    plan_key: None,
                },
                Effect::GrantOfSubscription {
                    payment: "in_1".into(),
                    subscriptions: subscriptions.iter().map(|s| (*s).to_owned()).collect(),
                    read: "the paths".into(),
                },
            ]
        };
        let mut registers = Registers::default();
        let mut other = sub("active", Some("pro"));
        other.customer = "cus_2".into();
        registers
            .subscriptions
            .insert("sub_other".into(), held(other, 1, 1, 3, "evt_1"));
        registers.subscriptions.insert(
            "sub_unknown_plan".into(),
            held(sub("active", Some("price_gone")), 2, 1, 3, "evt_2"),
        );
        registers.subscriptions.insert(
            "sub_pro".into(),
            held(sub("active", Some("pro")), 3, 1, 3, "evt_3"),
        );

        let (out, notes, ungranted) = registers.plan_of_subscription(
            &ctx,
            &effects(&["sub_other", "sub_unknown_plan", "sub_pro"]),
            &catalog,
            &SubscriptionRead::NotRead,
        );
        assert!(!ungranted);
        assert_eq!(
            out,
            vec![
                Effect::Payment {
                    id: "in_1".into(),
                    status: PaymentStatus::Paid,
                    plan_key: Some("pro".into()),
                },
                Effect::Grant {
                    plan: catalog.resolve(&["pro"]).unwrap().unwrap()
                },
            ]
        );
        assert_eq!(
            notes,
            vec!["plan pro from subscription sub_pro (pro): the lines name no known price"]
        );

        for (named, register) in [
            (
                &["sub_other", "sub_unknown_plan"][..],
                "the subscription register holds no known plan for sub_other, sub_unknown_plan",
            ),
            (&[][..], "the invoice names no subscription"),
        ] {
            let (out, notes, ungranted) = registers.plan_of_subscription(
                &ctx,
                &effects(named),
                &catalog,
                &SubscriptionRead::NotRead,
            );
            assert!(ungranted);
            assert_eq!(out, effects(named)[..1].to_vec());
            assert_eq!(
                notes,
                vec![format!("no allowance granted: read the paths; {register}")]
            );
        }
    }

    /// When the register holds none of the invoice's subscriptions, the provider's read of one
    /// gives the plan, if it is this customer's and names a known plan; else the reason says
    /// what the provider showed.
    #[test]
    fn an_invoice_takes_the_plan_the_provider_shows_when_the_register_holds_none() {
        let catalog = Catalog::parse(r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#).unwrap();
        let customer = CustomerId::parse("cus_1").unwrap();
        let ctx = ctx(&customer, 9, 1_767_225_601, "evt_9");
        let effects = vec![
            Effect::Payment {
                id: "in_1".into(),
                status: PaymentStatus::Paid,
                plan_key: None,
            },
            Effect::GrantOfSubscription {
                payment: "in_1".into(),
                subscriptions: vec!["sub_new".into()],
                read: "the paths".into(),
            },
        ];
        let pro = catalog.resolve(&["pro"]).unwrap().unwrap();
        let shown = |customer: &str, plan: Option<PlanRef>| {
            SubscriptionRead::Read(ShownSubscription {
                id: "sub_new".into(),
                customer: customer.into(),
                plan,
                event_id: 12,
            })
        };
        let registers = Registers::default();
        let (out, notes, ungranted) = registers.plan_of_subscription(
            &ctx,
            &effects,
            &catalog,
            &shown("cus_1", Some(pro.clone())),
        );
        assert!(!ungranted);
        assert_eq!(out[1], Effect::Grant { plan: pro.clone() });
        assert!(matches!(&out[0], Effect::Payment { plan_key: Some(k), .. } if k == "pro"));
        assert_eq!(
            notes,
            vec!["plan pro from subscription sub_new as the provider shows it (read, event 12) (pro): the lines name no known price"]
        );
        let base = "no allowance granted: read the paths; the subscription register holds no known plan for sub_new";
        for (read, said) in [
            (
                shown("cus_2", Some(pro.clone())),
                "; the provider shows sub_new as cus_2's (read, event 12)",
            ),
            (
                shown("cus_1", None),
                "; the provider shows sub_new with no known plan (read, event 12)",
            ),
            (
                SubscriptionRead::NoApiKey,
                "; the source has no API key to read it from the provider",
            ),
            (
                SubscriptionRead::Unknown("sub_new".into()),
                "; the provider does not know sub_new",
            ),
        ] {
            let (out, notes, ungranted) =
                registers.plan_of_subscription(&ctx, &effects, &catalog, &read);
            assert!(ungranted);
            assert_eq!(out, effects[..1].to_vec());
            assert_eq!(notes, vec![format!("{base}{said}")]);
        }
    }
}
