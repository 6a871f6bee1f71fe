//! The fold of one account's events (docs/design.md §4.11): its registers and ledger as the
//! register rules leave them when each of its stored events is applied once, in provider
//! order, from nothing — one definition of what the state should be, used by the simulator,
//! the audit, `why` and `--at`. Pure: the events come decided (their provider's decision,
//! with what the provider reads settled for them when they were applied), and the fold also
//! keeps every write each event attempted, so that each field can say which event decided it
//! and which it beat, and why.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::model::{outcome, Change, Decision, Effect, EventContext, PaymentStatus, Rank, Settled};
use super::model::{status_entitles, Version};
use super::rules::{Held, LedgerEntry, Registers, Stamp, SubscriptionRead};
use crate::domain::{Catalog, CustomerId, DedupeKey, EventStatus, Period, ProviderTime};

/// How an event reached the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// Delivered to the intake.
    Webhook,
    /// Delivered through Stripe's EventBridge partner source.
    EventBridge,
    /// Found by reconciliation in the provider's event list.
    Reconciliation,
    /// A corrective event reconciliation wrote from the provider's current state.
    Correction,
    /// A read of an object the worker made (a thin event's, an invoice's subscription).
    Fetch,
}

impl Via {
    /// How an event reached the store: by its key (a worker's read, a reconciliation's
    /// correction) or what its first delivery row says (`headers.via`).
    pub fn of(dedupe_key: &str, first_delivery_via: Option<&str>) -> Self {
        if dedupe_key.starts_with("read:") {
            return Self::Fetch;
        }
        if dedupe_key.starts_with("reconcile:") {
            return Self::Correction;
        }
        match first_delivery_via {
            Some("reconciliation") => Self::Reconciliation,
            Some("eventbridge") => Self::EventBridge,
            Some(_) => Self::Fetch,
            None => Self::Webhook,
        }
    }
}

/// One stored event, decided, as the fold takes it.
#[derive(Debug, Clone)]
pub struct FoldEvent {
    pub id: i64,
    pub key: DedupeKey,
    pub event_type: String,
    pub at: ProviderTime,
    /// Its provider's decision, from the event alone.
    pub decision: Decision,
    /// Why the source takes none of it (a Stripe event of the other mode), when it does not.
    pub excluded: Option<String>,
    pub settled: Settled,
    /// The stored read of an invoice's subscription, when one was made for this event.
    pub shown: SubscriptionRead,
}

/// A register or field a write aims at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    CustomerPlan,
    Standing,
    Subscription(String),
    Payment(String),
    /// A grant of `plan` in `period`.
    Grant {
        period: String,
        plan: String,
    },
    Deleted,
    /// An entitlement register, by its grant's id.
    Entitlement(String),
}

/// One write an event's effect attempted, and what it did then.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub event_id: i64,
    pub target: Target,
    /// The version it writes at (`None` for a grant or a tombstone).
    pub stamp: Option<Stamp>,
    pub change: Change,
    pub excluded: Option<String>,
}

/// What the fold leaves: the account's registers (every subscription, payment and payment
/// intent its events wrote), its ledger by period, each event's outcome, and every attempt.
#[derive(Debug, Clone, Default)]
pub struct Folded {
    pub registers: Registers,
    pub ledger: BTreeMap<String, Vec<LedgerEntry>>,
    pub outcomes: BTreeMap<i64, (EventStatus, String)>,
    pub attempts: Vec<Attempt>,
}

/// What the fold carries from one event to the next: the registers and the ledger by period,
/// all that the register rules read. The audit's checked point keeps it at a cut and the
/// next audit goes on from it (`fold_from`, docs/design.md §4.11); each event's outcome and
/// attempts, which only explain, are not carried.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoldState {
    pub registers: Registers,
    pub ledger: BTreeMap<String, Vec<LedgerEntry>>,
}

/// Applies `events` once each, in provider order (time to the microsecond, then dedupe key),
/// to an empty account.
pub fn fold(
    source: &str,
    customer: &CustomerId,
    events: &[FoldEvent],
    catalog: &Catalog,
) -> Folded {
    fold_from(FoldState::default(), source, customer, events, catalog)
}

/// Applies `events` once each, in provider order, to the account as `start` leaves it: the
/// fold of a set of events is the fold of those up to a cut, from nothing, then of the rest
/// from there, when every event of the rest comes after the cut in that order.
pub fn fold_from(
    start: FoldState,
    source: &str,
    customer: &CustomerId,
    events: &[FoldEvent],
    catalog: &Catalog,
) -> Folded {
    let mut order: Vec<&FoldEvent> = events.iter().collect();
    order.sort_by(|a, b| {
        let at = |e: &FoldEvent| e.at.as_datetime().timestamp_micros();
        (at(a), a.key.as_str(), a.id).cmp(&(at(b), b.key.as_str(), b.id))
    });
    let mut folded = Folded {
        registers: start.registers,
        ledger: start.ledger,
        ..Folded::default()
    };
    for event in order {
        let ctx = EventContext {
            event_id: event.id,
            source,
            customer,
            event_type: &event.event_type,
            dedupe_key: &event.key,
            version: Version {
                at: event.at,
                key: event.key.clone(),
            },
        };
        let (effects, notes) = match &event.decision {
            Decision::Apply { effects, notes } => (effects, notes),
            Decision::Ignore(reason) => {
                folded
                    .outcomes
                    .insert(event.id, (EventStatus::Ignored, reason.clone()));
                continue;
            }
            Decision::Unprocessable(reason) => {
                folded
                    .outcomes
                    .insert(event.id, (EventStatus::Unprocessable, reason.clone()));
                continue;
            }
        };
        if let Some(reason) = &event.excluded {
            // Out of the source's scope: it writes nothing, and each register it names shows
            // it beaten for that reason.
            for effect in effects {
                if let Some(target) = target_of(effect, &ctx, &folded.registers) {
                    folded.attempts.push(Attempt {
                        event_id: event.id,
                        target,
                        stamp: None,
                        change: Change::Superseded(reason.clone()),
                        excluded: Some(reason.clone()),
                    });
                }
            }
            folded
                .outcomes
                .insert(event.id, (EventStatus::Ignored, reason.clone()));
            continue;
        }
        folded.apply(&ctx, event, effects, notes, catalog);
    }
    folded.registers.changed = Default::default();
    folded
}

impl Folded {
    fn apply(
        &mut self,
        ctx: &EventContext<'_>,
        event: &FoldEvent,
        effects: &[Effect],
        notes: &[String],
        catalog: &Catalog,
    ) {
        let period = Period::of(ctx.version.at);
        let mut effects = effects.to_vec();
        event.settled.apply_to(&mut effects);
        let registers = &mut self.registers;
        registers.ledger = self.ledger.remove(period.as_str()).unwrap_or_default();
        let (effects, resolved, _) =
            registers.plan_of_subscription(ctx, &effects, catalog, &event.shown);
        let mut notes = notes.to_vec();
        notes.extend(resolved);
        let mut changes = Vec::with_capacity(effects.len());
        for effect in &effects {
            let written = registers.apply(ctx, effect);
            if let Some(target) = target_of(effect, ctx, registers) {
                self.attempts.push(Attempt {
                    event_id: event.id,
                    stamp: stamp_of(effect, ctx),
                    target,
                    change: written.change.clone(),
                    excluded: None,
                });
            }
            changes.push(written.change);
        }
        let ledger = std::mem::take(&mut registers.ledger);
        if !ledger.is_empty() {
            self.ledger.insert(period.as_str().to_owned(), ledger);
        }
        self.outcomes.insert(event.id, outcome(&changes, &notes));
    }

    /// The account's state in `period` as the fold leaves it (plan, allowance; no debits).
    pub fn state(
        &self,
        customer: &CustomerId,
        period: &Period,
        catalog: &Catalog,
    ) -> super::model::AccountState {
        let mut registers = self.registers.clone();
        registers.ledger = self
            .ledger
            .get(period.as_str())
            .cloned()
            .unwrap_or_default();
        registers.state(customer.as_str(), period, catalog)
    }

    /// What the next event's rules would read: the state a checked point keeps.
    pub fn state_at_cut(&self) -> FoldState {
        FoldState {
            registers: self.registers.clone(),
            ledger: self.ledger.clone(),
        }
    }

    /// The fields the fold gives and the event each register's holder is, by field name.
    pub fn fields(&self) -> BTreeMap<String, (Value, Option<i64>)> {
        fields_of(&self.registers, &self.ledger)
    }
}

/// The register an effect writes, once applied to `registers` (a refund through a payment
/// intent writes the invoice's payment once the intent's invoice is known).
fn target_of(effect: &Effect, ctx: &EventContext<'_>, registers: &Registers) -> Option<Target> {
    Some(match effect {
        Effect::CustomerPlan { .. } => Target::CustomerPlan,
        Effect::Standing { .. } => Target::Standing,
        Effect::Subscription { id, .. } => Target::Subscription(id.clone()),
        Effect::Payment { id, .. } => Target::Payment(id.clone()),
        Effect::Grant { plan } => Target::Grant {
            period: Period::of(ctx.version.at).as_str().to_owned(),
            plan: plan.plan.clone(),
        },
        Effect::DeleteCustomer => Target::Deleted,
        Effect::Entitlement { grant, .. } => Target::Entitlement(grant.clone()),
        Effect::PaymentIntent { payment_intent, .. }
        | Effect::RefundIntent { payment_intent, .. } => {
            let intent = registers.intents.get(payment_intent)?;
            intent.refunded_by?;
            Target::Payment(intent.invoice.clone()?)
        }
        // Credits are compared with the provider's balances, not folded here (§4.14).
        Effect::GrantOfSubscription { .. }
        | Effect::CreditGrant(_)
        | Effect::CreditTransaction(_)
        | Effect::PackBought { .. } => return None,
    })
}

fn stamp_of(effect: &Effect, ctx: &EventContext<'_>) -> Option<Stamp> {
    match effect {
        Effect::CustomerPlan { .. } | Effect::Standing { .. } | Effect::Entitlement { .. } => {
            Some(Stamp::of(ctx, Rank(0)))
        }
        Effect::Subscription { rank, .. } => Some(Stamp::of(ctx, *rank)),
        Effect::Payment { status, .. } => Some(Stamp::of(ctx, Rank::of_payment(*status))),
        Effect::PaymentIntent { .. } | Effect::RefundIntent { .. } => {
            Some(Stamp::of(ctx, Rank::of_payment(PaymentStatus::Refunded)))
        }
        _ => None,
    }
}

fn time(at: Option<DateTime<Utc>>) -> Value {
    match at {
        Some(at) => json!(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        None => Value::Null,
    }
}

/// The fields of an account's registers and ledger, each with the event its register holds:
/// the names of `inboxctl why` and the audit (docs/design.md §5.5a). Every value a register
/// holds that the app API or `inboxctl account` shows is one (a plan by the catalog's name as
/// they show it, and by the provider's key it came as), so that the audit compares it. The
/// derived plan is not among them (it follows from these); a period's allowance is its
/// ledger's sum, which is its largest grant whatever order the grants came in.
pub fn fields_of(
    registers: &Registers,
    ledger: &BTreeMap<String, Vec<LedgerEntry>>,
) -> BTreeMap<String, (Value, Option<i64>)> {
    let mut fields = BTreeMap::new();
    if let Some(held) = &registers.customer_plan {
        let by = Some(held.event_id);
        fields.insert("customer_plan".to_owned(), (json!(held.value.plan), by));
        fields.insert("customer_plan_key".to_owned(), (json!(held.value.key), by));
    }
    if let Some(held) = &registers.standing {
        let standing = match held.value {
            true => "past_due",
            false => "good",
        };
        fields.insert(
            "standing".to_owned(),
            (json!(standing), Some(held.event_id)),
        );
    }
    for (id, held) in &registers.subscriptions {
        let s = &held.value;
        let by = Some(held.event_id);
        let field = |name: &str| format!("subscription:{id}:{name}");
        fields.insert(field("status"), (json!(s.status), by));
        fields.insert(field("plan"), (json!(s.plan), by));
        fields.insert(field("plan_key"), (json!(s.plan_key), by));
        fields.insert(
            field("current_period_end"),
            (time(s.ends.current_period_end), by),
        );
        fields.insert(
            field("cancel_at_period_end"),
            (json!(s.ends.cancel_at_period_end), by),
        );
        fields.insert(field("cancel_at"), (time(s.ends.cancel_at), by));
        fields.insert(field("trial_end"), (time(s.ends.trial_end), by));
        fields.insert(field("ended_at"), (time(s.ends.ended_at), by));
    }
    for (id, held) in &registers.payments {
        fields.insert(
            format!("payment:{id}:status"),
            (json!(held.value.status), Some(held.event_id)),
        );
    }
    // A full refund of a charge whose invoice is not known yet shows on the charge (§4.6).
    for intent in registers.intents.values() {
        if let (None, Some(charge)) = (&intent.invoice, &intent.refunded_charge) {
            fields.insert(
                format!("payment:{charge}:status"),
                (json!(PaymentStatus::Refunded.as_str()), intent.refunded_by),
            );
        }
    }
    for (period, entries) in ledger {
        let sum: i64 = entries.iter().map(|e| e.delta).sum();
        let by = largest(entries).map(|e| e.event_id);
        fields.insert(format!("allowance:{period}"), (json!(sum), by));
    }
    for (grant, held) in &registers.entitlements {
        let value = json!({"active": held.value.active, "features": held.value.features});
        fields.insert(format!("entitlement:{grant}"), (value, Some(held.event_id)));
    }
    if let Some(at) = registers.account.deleted_at {
        fields.insert(
            "deleted".to_owned(),
            (time(Some(at)), registers.account.deleted_by),
        );
    }
    fields
}

/// The grant that holds a period's balance: the largest allowance, the first granted of
/// equals.
fn largest(entries: &[LedgerEntry]) -> Option<&LedgerEntry> {
    entries
        .iter()
        .rev()
        .max_by_key(|e| e.allowance)
        .or(entries.first())
}

/// An event a field's holder beat, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Beaten {
    pub event_id: i64,
    /// One of: `older`, `same-second tie settled by a provider read`, `same-second tie
    /// settled by status rank`, `same-second tie settled by dedupe key`, `refunded is final`,
    /// `unknown price`, `other mode`, `customer deleted`, `payments past due`, `smaller plan`,
    /// `smaller allowance`, `already granted`, `later deletion`, `already held` (a later
    /// write that found the same value there: its event is `ignored`, "… already"), and for
    /// a feature `smaller value` (another source gives the key less) and `revoked` (a grant
    /// that gave it is no longer active).
    pub reason: &'static str,
    pub detail: String,
}

/// One field explained: its value, the event that decided it and those it beat.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explained {
    pub field: String,
    pub value: Value,
    pub decided_by: Option<i64>,
    pub beaten: Vec<Beaten>,
}

impl Folded {
    /// Every field of the fold, explained: the derived plan first, then the registers, the
    /// ledger's periods and the tombstone.
    pub fn explain(&self, customer: &CustomerId, catalog: &Catalog) -> Vec<Explained> {
        let plan = self.explain_plan(customer, catalog);
        let features = self.explain_features(customer, catalog, &plan);
        let mut out = vec![plan];
        out.extend(features);
        let fields = self.fields();
        for (field, (value, by)) in fields {
            let beaten = match field.split(':').collect::<Vec<_>>().as_slice() {
                ["customer_plan" | "customer_plan_key"] => {
                    self.beaten_on(&Target::CustomerPlan, by)
                }
                ["standing"] => self.beaten_on(&Target::Standing, by),
                ["subscription", id, _] => self.beaten_on(&Target::Subscription((*id).into()), by),
                ["payment", id, _] => self.beaten_on(&Target::Payment((*id).into()), by),
                ["allowance", period] => self.beaten_grants(period, by),
                ["deleted"] => self.beaten_on(&Target::Deleted, by),
                ["entitlement", grant] => self.beaten_on(&Target::Entitlement((*grant).into()), by),
                _ => Vec::new(),
            };
            out.push(Explained {
                decided_by: self.decider_of_field(&field, by),
                field,
                value,
                beaten,
            });
        }
        out
    }

    /// The attempts on a last-writer-wins register other than its holder's, each with why
    /// the holder's version is ahead of it.
    fn beaten_on(&self, target: &Target, holder: Option<i64>) -> Vec<Beaten> {
        let holder = self.decider(target, holder);
        let held_at = holder.and_then(|h| {
            self.attempts
                .iter()
                .position(|a| a.event_id == h && a.target == *target)
        });
        let held = held_at.map(|at| &self.attempts[at]);
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for (at, attempt) in self.attempts.iter().enumerate() {
            if attempt.target != *target
                || Some(attempt.event_id) == holder
                || !seen.insert(attempt.event_id)
            {
                continue;
            }
            let confirmed =
                held_at.is_some_and(|h| at > h) && matches!(attempt.change, Change::Unchanged(_));
            let (reason, detail) = match (&attempt.excluded, target, held) {
                (Some(why), _, _) => ("other mode", why.clone()),
                (None, _, _) if confirmed => ("already held", words(&attempt.change)),
                (None, Target::Deleted, _) => (
                    "later deletion",
                    "the earliest deletion is the one kept".to_owned(),
                ),
                (None, _, Some(held)) => versus(held, attempt, &self.registers, target),
                (None, _, None) => ("older", words(&attempt.change)),
            };
            out.push(Beaten {
                event_id: attempt.event_id,
                reason,
                detail,
            });
        }
        out
    }

    /// The grants of a period besides the one that holds its balance.
    fn beaten_grants(&self, period: &str, holder: Option<i64>) -> Vec<Beaten> {
        let entries = self.ledger.get(period).map(Vec::as_slice).unwrap_or(&[]);
        let top = largest(entries);
        let mut out = Vec::new();
        for attempt in &self.attempts {
            let Target::Grant { period: p, plan } = &attempt.target else {
                continue;
            };
            if p != period || Some(attempt.event_id) == holder {
                continue;
            }
            let entry = entries.iter().find(|e| e.event_id == attempt.event_id);
            let (reason, detail) = match (&attempt.excluded, entry, top) {
                (Some(why), _, _) => ("other mode", why.clone()),
                (None, Some(entry), Some(top)) => (
                    "smaller allowance",
                    format!(
                        "{plan} grants {}; {} grants {}",
                        entry.allowance, top.plan, top.allowance
                    ),
                ),
                (None, _, _) => ("already granted", words(&attempt.change)),
            };
            out.push(Beaten {
                event_id: attempt.event_id,
                reason,
                detail,
            });
        }
        out
    }

    /// The derived plan (docs/design.md §4.5): the register that gives it, or, on free, the
    /// write that took the last entitlement away; the candidates it beat, and what that
    /// deciding register beat (each with its reason).
    fn explain_plan(&self, customer: &CustomerId, catalog: &Catalog) -> Explained {
        let r = &self.registers;
        let period = Period::current();
        let plan = r.state(customer.as_str(), &period, catalog).plan;
        let mut beaten = Vec::new();
        // Each register that could entitle: its holder, version, plan, the register, in words.
        let mut candidates: Vec<(i64, &Stamp, Option<&str>, Target, String)> = Vec::new();
        if let Some(held) = &r.customer_plan {
            let set_by = self.set_by(Target::CustomerPlan, held.event_id);
            let entitled = held.value.plan.as_deref();
            let past_due = r.standing.as_ref().is_some_and(|s| s.value);
            match (&held.value.key, entitled) {
                (Some(key), None) => beaten.push(Beaten {
                    event_id: set_by,
                    reason: "unknown price",
                    detail: format!("plan key '{key}' is not in the plan catalog"),
                }),
                (_, Some(name)) if past_due => beaten.push(Beaten {
                    event_id: set_by,
                    reason: "payments past due",
                    detail: format!("the plan register's {name} does not count while past due"),
                }),
                _ => {}
            }
            if !past_due {
                let what = format!("the plan register holds {:?}", held.value.key);
                let target = Target::CustomerPlan;
                candidates.push((set_by, &held.stamp, entitled, target, what));
            }
        }
        for (id, held) in &r.subscriptions {
            let s = &held.value;
            let set_by = self.set_by(Target::Subscription(id.clone()), held.event_id);
            let entitles = status_entitles(&s.status);
            if entitles && s.plan.is_none() {
                let key = s.plan_key.as_deref().unwrap_or("none");
                beaten.push(Beaten {
                    event_id: set_by,
                    reason: "unknown price",
                    detail: format!(
                        "subscription {id} is {} on '{key}', which is not in the plan catalog",
                        s.status
                    ),
                });
            }
            let plan = s.plan.as_deref().filter(|_| entitles);
            let what = format!("subscription {id} is {}", s.status);
            let target = Target::Subscription(id.clone());
            candidates.push((set_by, &held.stamp, plan, target, what));
        }
        let allowance = |name: &str| catalog.allowance_of(name).unwrap_or(0);
        let deleted = r.account.deleted_at.is_some();
        let winner = candidates
            .iter()
            .filter(|c| c.2 == Some(plan.as_str()))
            .max_by_key(|c| c.1);
        // The register that decides, and its holder.
        let deciding = match (deleted, winner) {
            (true, _) => Some((r.account.deleted_by, Target::Deleted)),
            (false, Some(w)) => Some((Some(w.0), w.3.clone())),
            // Free: the latest write among the registers that could entitle took it away.
            (false, None) => candidates
                .iter()
                .max_by_key(|c| c.1)
                .map(|c| (Some(c.0), c.3.clone())),
        };
        let decided_by = deciding.as_ref().and_then(|d| d.0);
        for (event_id, _, entitled, _, what) in &candidates {
            let Some(name) = entitled else { continue };
            if Some(*event_id) == decided_by {
                continue;
            }
            let (reason, detail) = match deleted {
                true => (
                    "customer deleted",
                    format!("{what} ({name}), but the customer is deleted"),
                ),
                false if *name == plan => continue,
                false => (
                    "smaller plan",
                    format!(
                        "{what} on {name} ({}), below {plan} ({})",
                        allowance(name),
                        allowance(&plan)
                    ),
                ),
            };
            beaten.push(Beaten {
                event_id: *event_id,
                reason,
                detail,
            });
        }
        // What the deciding register beat is what the plan beat: "why pro, when a cancellation
        // came in?" is answered here, not only under the register's own field.
        if let Some((holder, target)) = &deciding {
            for lost in self.beaten_on(target, *holder) {
                if !beaten.iter().any(|b| b.event_id == lost.event_id) {
                    beaten.push(lost);
                }
            }
        }
        for attempt in &self.attempts {
            if let (Some(why), Target::CustomerPlan | Target::Subscription(_)) =
                (&attempt.excluded, &attempt.target)
            {
                if beaten.iter().any(|b| b.event_id == attempt.event_id) {
                    continue;
                }
                beaten.push(Beaten {
                    event_id: attempt.event_id,
                    reason: "other mode",
                    detail: why.clone(),
                });
            }
        }
        Explained {
            field: "plan".to_owned(),
            value: json!(plan),
            decided_by,
            beaten,
        }
    }
}

impl Folded {
    /// Each feature the account has (docs/design.md §4.12), as a field `feature:<key>`: its
    /// value, the source that gives it — the catalog through the plan (`decided_by` the plan's
    /// decider; a tie goes to the catalog) or the active entitlement that gives it (of
    /// several with that value, the earliest by version; `decided_by` the event that set the
    /// register) — and what it beat: the other sources that give the key less, the grants
    /// that gave it and are revoked, and what the giving register beat.
    fn explain_features(
        &self,
        customer: &CustomerId,
        catalog: &Catalog,
        plan: &Explained,
    ) -> Vec<Explained> {
        let r = &self.registers;
        let state = r.state(customer.as_str(), &Period::current(), catalog);
        let of_plan = catalog.features_of(&state.plan);
        let mut out = Vec::new();
        for (key, value) in &state.features {
            let giver = (of_plan.get(key) != Some(value))
                .then(|| {
                    r.entitlements
                        .iter()
                        .filter(|(_, h)| h.value.active && h.value.features.get(key) == Some(value))
                        .min_by(|a, b| a.1.stamp.cmp(&b.1.stamp))
                })
                .flatten();
            let mut beaten = Vec::new();
            let decided_by = match giver {
                None => plan.decided_by,
                Some((grant, held)) => {
                    let target = Target::Entitlement(grant.clone());
                    let by = self.set_by(target.clone(), held.event_id);
                    beaten.extend(self.beaten_on(&target, Some(held.event_id)));
                    Some(by)
                }
            };
            if let (Some(less), Some(by), Some(_)) = (of_plan.get(key), plan.decided_by, giver) {
                beaten.push(Beaten {
                    event_id: by,
                    reason: "smaller value",
                    detail: format!("the catalog's {} gives {key}={less}", state.plan),
                });
            }
            for (grant, held) in &r.entitlements {
                let Some(given) = held.value.features.get(key) else {
                    continue;
                };
                if giver.is_some_and(|(g, _)| g == grant) {
                    continue;
                }
                let by = self.set_by(Target::Entitlement(grant.clone()), held.event_id);
                let (reason, detail) = match held.value.active {
                    false => ("revoked", format!("entitlement {grant} gave {key}={given}")),
                    true if given == value => continue,
                    true => (
                        "smaller value",
                        format!("entitlement {grant} gives {key}={given}"),
                    ),
                };
                if Some(by) != decided_by && !beaten.iter().any(|b| b.event_id == by) {
                    beaten.push(Beaten {
                        event_id: by,
                        reason,
                        detail,
                    });
                }
            }
            out.push(Explained {
                field: format!("feature:{key}"),
                value: json!(value),
                decided_by,
                beaten,
            });
        }
        out
    }
}

// One story with the account's log: an event whose write found the register already
// holding the same value took the register's version (so that a write between the two in
// provider time cannot win, §4.2) but changed nothing, and its log line says `ignored`
// ("… already"). It is not what decided the field: the event that set the value is, and the
// later one is listed as `already held`, with its log line's words.
impl Folded {
    /// The event that set the value `target` holds: its holder, or, when the holder's write
    /// changed nothing, the latest write before it that did. The holder when the fold has
    /// no such write (the setter was purged, or the registers were not folded).
    fn decider(&self, target: &Target, holder: Option<i64>) -> Option<i64> {
        let holder = holder?;
        let attempts = &self.attempts;
        let Some(at) = attempts
            .iter()
            .rposition(|a| a.event_id == holder && a.target == *target)
        else {
            return Some(holder);
        };
        if !matches!(attempts[at].change, Change::Unchanged(_)) {
            return Some(holder);
        }
        let setter = attempts[..at]
            .iter()
            .rev()
            .filter(|a| a.target == *target)
            .find(|a| matches!(a.change, Change::Made(_)));
        Some(setter.map_or(holder, |a| a.event_id))
    }

    /// [`Folded::decider`] of a register that has a holder.
    fn set_by(&self, target: Target, holder: i64) -> i64 {
        self.decider(&target, Some(holder)).unwrap_or(holder)
    }

    /// [`Folded::decider`] of a field by its name (the ledger and the tombstone have none
    /// other than their holder).
    fn decider_of_field(&self, field: &str, holder: Option<i64>) -> Option<i64> {
        let target = match field.split(':').collect::<Vec<_>>().as_slice() {
            ["customer_plan"] => Target::CustomerPlan,
            ["standing"] => Target::Standing,
            ["subscription", id, _] => Target::Subscription((*id).into()),
            ["payment", id, _] => Target::Payment((*id).into()),
            ["entitlement", grant] => Target::Entitlement((*grant).into()),
            _ => return holder,
        };
        self.decider(&target, holder)
    }
}

/// Why the register's holder is ahead of another write to it.
fn versus(
    held: &Attempt,
    other: &Attempt,
    registers: &Registers,
    target: &Target,
) -> (&'static str, String) {
    if let Target::Payment(id) = target {
        let refunded = registers
            .payments
            .get(id)
            .is_some_and(|p: &Held<_>| p.value.status == PaymentStatus::Refunded.as_str());
        if refunded && held.stamp.is_some() && other.stamp > held.stamp {
            return (
                "refunded is final",
                format!("payment {id} is refunded, which is final"),
            );
        }
    }
    let (Some(h), Some(o)) = (&held.stamp, &other.stamp) else {
        return ("older", words(&other.change));
    };
    if o.at != h.at {
        return (
            "older",
            format!(
                "its provider time {} is before {}",
                time(Some(o.at)).as_str().unwrap_or_default(),
                time(Some(h.at)).as_str().unwrap_or_default()
            ),
        );
    }
    let read = |rank: i64| !(0..1000).contains(&rank);
    if read(h.rank) || read(o.rank) {
        return (
            "same-second tie settled by a provider read",
            "the provider's read showed the holder's state".to_owned(),
        );
    }
    if h.rank != o.rank {
        return (
            "same-second tie settled by status rank",
            format!("rank {} below {}", o.rank, h.rank),
        );
    }
    (
        "same-second tie settled by dedupe key",
        format!("'{}' sorts before '{}'", o.key, h.key),
    )
}

fn words(change: &Change) -> String {
    match change {
        Change::Made(w) | Change::Unchanged(w) | Change::Superseded(w) => w.clone(),
        Change::AlreadyApplied(w) => w.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::model::SubscriptionEnds;
    use crate::domain::PlanRef;

    fn catalog() -> Catalog {
        Catalog::parse(r#"{"price_pro": {"plan": "pro", "monthly_allowance": 500}}"#).unwrap()
    }

    /// A subscription event of `sub_1` at `secs`, with the status's own rank.
    fn event(id: i64, key: &str, secs: i64, status: &str) -> FoldEvent {
        let plan = PlanRef {
            key: "price_pro".into(),
            plan: "pro".into(),
            monthly_allowance: 500,
        };
        let effect = Effect::Subscription {
            id: "sub_1".into(),
            status: status.into(),
            plan: Some(plan),
            ends: SubscriptionEnds::default(),
            rank: Rank::of_status(status),
        };
        FoldEvent {
            id,
            key: DedupeKey::parse(key).unwrap(),
            event_type: "customer.subscription.updated".into(),
            at: ProviderTime::from_unix_secs(secs).unwrap(),
            decision: Decision::Apply {
                effects: vec![effect],
                notes: Vec::new(),
            },
            excluded: None,
            settled: Settled::default(),
            shown: SubscriptionRead::NotRead,
        }
    }

    fn explained(events: &[FoldEvent], name: &str) -> Explained {
        let customer = CustomerId::parse("cus_1").unwrap();
        let folded = fold("stripe", &customer, events, &catalog());
        folded
            .explain(&customer, &catalog())
            .into_iter()
            .find(|e| e.field == name)
            .unwrap()
    }

    #[test]
    fn the_fold_is_the_same_in_every_input_order_and_names_why_each_write_lost() {
        let events = [
            event(1, "evt_a", 100, "trialing"),
            event(2, "evt_b", 200, "active"),
            event(3, "evt_c", 200, "past_due"),
            event(4, "evt_d", 300, "canceled"),
        ];
        let mut reversed = events.to_vec();
        reversed.reverse();
        let status = explained(&events, "subscription:sub_1:status");
        assert_eq!(status, explained(&reversed, "subscription:sub_1:status"));
        assert_eq!(
            (status.value, status.decided_by),
            (json!("canceled"), Some(4))
        );
        let reasons: Vec<(i64, &str)> = status
            .beaten
            .iter()
            .map(|b| (b.event_id, b.reason))
            .collect();
        assert_eq!(reasons, [(1, "older"), (2, "older"), (3, "older")]);

        // Without the cancellation, past_due outranks active in the same second.
        let status = explained(&events[..3], "subscription:sub_1:status");
        assert_eq!(
            (status.value, status.decided_by),
            (json!("past_due"), Some(3))
        );
        let reasons: Vec<(i64, &str)> = status
            .beaten
            .iter()
            .map(|b| (b.event_id, b.reason))
            .collect();
        assert_eq!(
            reasons,
            [(1, "older"), (2, "same-second tie settled by status rank")]
        );
    }

    #[test]
    fn an_event_that_found_the_value_already_there_did_not_decide_it() {
        // active at 100, the same state again at 200 (its log line: ignored, "already
        // active"), and an older trialing.
        let events = [
            event(1, "evt_a", 100, "active"),
            event(2, "evt_b", 200, "active"),
            event(3, "evt_c", 50, "trialing"),
        ];
        let status = explained(&events, "subscription:sub_1:status");
        assert_eq!(
            (status.value, status.decided_by),
            (json!("active"), Some(1))
        );
        let reasons: Vec<(i64, &str, &str)> = status
            .beaten
            .iter()
            .map(|b| (b.event_id, b.reason, b.detail.as_str()))
            .collect();
        assert_eq!(
            reasons,
            [
                (3, "older", "its provider time 1970-01-01T00:00:50.000000Z is before 1970-01-01T00:01:40.000000Z"),
                (2, "already held", "subscription sub_1 is already active")
            ]
        );
        assert_eq!(explained(&events, "plan").decided_by, Some(1));
    }

    #[test]
    fn a_kept_read_verdict_decides_the_tie_it_settled() {
        let mut active = event(2, "evt_b", 200, "active");
        active.settled.ranks.insert("sub_1".into(), 1_000_000);
        let events = [active, event(3, "evt_c", 200, "past_due")];
        let status = explained(&events, "subscription:sub_1:status");
        assert_eq!(
            (status.value, status.decided_by),
            (json!("active"), Some(2))
        );
        assert_eq!(
            status.beaten[0].reason,
            "same-second tie settled by a provider read"
        );
    }

    #[test]
    fn the_plan_lists_what_its_deciding_register_beat() {
        // A cancellation older than the activation: the plan says why it did not count.
        let events = [
            event(1, "evt_a", 100, "canceled"),
            event(2, "evt_b", 200, "active"),
        ];
        let plan = explained(&events, "plan");
        assert_eq!((plan.value, plan.decided_by), (json!("pro"), Some(2)));
        let reasons: Vec<(i64, &str)> =
            plan.beaten.iter().map(|b| (b.event_id, b.reason)).collect();
        assert_eq!(reasons, [(1, "older")]);
    }

    #[test]
    fn every_value_of_a_subscription_register_is_a_field() {
        let mut trial = event(1, "evt_a", 100, "trialing");
        if let Decision::Apply { effects, .. } = &mut trial.decision {
            if let Effect::Subscription { ends, .. } = &mut effects[0] {
                ends.trial_end = Some(ProviderTime::from_unix_secs(1_000).unwrap().as_datetime());
            }
        }
        let customer = CustomerId::parse("cus_1").unwrap();
        let fields = fold("stripe", &customer, &[trial], &catalog()).fields();
        let names: Vec<&str> = fields
            .keys()
            .filter_map(|f| f.strip_prefix("subscription:sub_1:"))
            .collect();
        assert_eq!(
            names,
            [
                "cancel_at",
                "cancel_at_period_end",
                "current_period_end",
                "ended_at",
                "plan",
                "plan_key",
                "status",
                "trial_end"
            ]
        );
        assert_eq!(fields["subscription:sub_1:plan"].0, json!("pro"));
        assert_eq!(fields["subscription:sub_1:plan_key"].0, json!("price_pro"));
        assert_eq!(
            fields["subscription:sub_1:trial_end"].0,
            json!("1970-01-01T00:16:40.000000Z")
        );
    }

    #[test]
    fn an_event_of_the_other_mode_writes_nothing_and_is_beaten_for_it() {
        let mut test_mode = event(5, "evt_t", 400, "active");
        test_mode.excluded = Some("a test-mode event on a live-mode source".into());
        let events = [event(4, "evt_d", 300, "canceled"), test_mode];
        let plan = explained(&events, "plan");
        assert_eq!(plan.value, json!("free"));
        assert_eq!(plan.decided_by, Some(4));
        assert_eq!(plan.beaten[0].reason, "other mode");
        let status = explained(&events, "subscription:sub_1:status");
        assert_eq!(status.value, json!("canceled"));
    }

    /// An entitlement event of `grant` at `secs`.
    fn grant(
        id: i64,
        key: &str,
        secs: i64,
        grant: &str,
        active: bool,
        features: Value,
    ) -> FoldEvent {
        let effect = Effect::Entitlement {
            grant: grant.into(),
            active,
            features: crate::domain::features::of_json_object(features.as_object().unwrap())
                .unwrap(),
            rank: crate::billing::Rank(0),
        };
        FoldEvent {
            event_type: "benefit_grant.updated".into(),
            decision: Decision::apply(vec![effect]),
            ..event(id, key, secs, "active")
        }
    }

    #[test]
    fn each_feature_is_a_field_with_its_source_and_what_it_beat_in_every_order() {
        let catalog = Catalog::parse(
            r#"{"price_pro": {"plan": "pro", "monthly_allowance": 500,
                              "features": {"sso": true, "seats": 5}}}"#,
        )
        .unwrap();
        let customer = CustomerId::parse("cus_1").unwrap();
        let events = [
            event(1, "evt_sub", 100, "active"),
            grant(
                2,
                "evt_g1",
                200,
                "grant_1",
                true,
                json!({"seats": 20, "sso": true}),
            ),
            grant(3, "evt_g2", 250, "grant_2", true, json!({"export": "csv"})),
            grant(
                4,
                "evt_g2_off",
                300,
                "grant_2",
                false,
                json!({"export": "csv"}),
            ),
            grant(5, "evt_g1_old", 150, "grant_1", true, json!({"seats": 1})),
        ];
        let mut orders = vec![events.to_vec()];
        let mut reversed = events.to_vec();
        reversed.reverse();
        orders.push(reversed);
        let mut answers = Vec::new();
        for order in &orders {
            let folded = fold("stripe", &customer, order, &catalog);
            let fields: BTreeMap<String, Explained> = folded
                .explain(&customer, &catalog)
                .into_iter()
                .filter(|e| e.field.starts_with("feature:"))
                .map(|e| (e.field.clone(), e))
                .collect();
            answers.push(format!("{fields:?}"));
            let names: Vec<&str> = fields.keys().map(String::as_str).collect();
            assert_eq!(
                names,
                ["feature:seats", "feature:sso"],
                "export was revoked"
            );
            let seats = &fields["feature:seats"];
            assert_eq!((&seats.value, seats.decided_by), (&json!(20), Some(2)));
            let reasons: Vec<(i64, &str)> = seats
                .beaten
                .iter()
                .map(|b| (b.event_id, b.reason))
                .collect();
            assert_eq!(reasons, [(5, "older"), (1, "smaller value")]);
            // A tie goes to the catalog, decided by the plan's register.
            let sso = &fields["feature:sso"];
            assert_eq!((&sso.value, sso.decided_by), (&json!(true), Some(1)));
            let state = folded.state(&customer, &Period::current(), &catalog);
            assert_eq!(
                serde_json::to_value(&state.features).unwrap(),
                json!({"seats": 20, "sso": true})
            );
            assert_eq!(
                folded.fields()["entitlement:grant_2"].0,
                json!({"active": false, "features": {"export": "csv"}})
            );
        }
        assert_eq!(answers[0], answers[1]);
    }
}
