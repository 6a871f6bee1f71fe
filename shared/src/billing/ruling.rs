//! The register rules run on one event (docs/design.md §4): its effects, as its provider
//! decided them and provider reads settled them, applied to the account's registers as read,
//! giving the event's outcome and reason and, with effects on, what its effects are told from.
//! Pure: the worker reads the registers and writes what this gives.

use std::collections::HashMap;

use super::rules::{Registers, Stamp, SubscriptionRead};
use super::{outcome, AccountState, Change, Effect, EventContext, Fact, Rank};
use crate::domain::{Catalog, EventStatus, Period};

/// The register rules applied to the account as read: the event's outcome and reason, and,
/// with effects on (`effects_on`) and a change made, what its effects are told from. With
/// provider reads, a subscription whose tie is not the one the read settled, or an entitlement
/// register of `tie_grants` found tied that the first read found not, is a [`TieMoved`] (the
/// retry reads again).
pub fn rule(
    ctx: &EventContext<'_>,
    registers: &mut Registers,
    (catalog, effects_on): (&Catalog, bool),
    (effects, notes): (&[Effect], &[String]),
    reads: bool,
    (ties_read, shown, tie_grants): (&TiesRead, &SubscriptionRead, &[&str]),
) -> Result<Ruling, TieMoved> {
    // A tie a read settles that the first read of the account did not find: another event of
    // the same second was written since. The retry reads the account again, and the provider.
    if tie_grants
        .iter()
        .any(|grant| tie_on(ctx, registers, grant).is_some())
    {
        return Err(TieMoved);
    }
    let period = Period::of(ctx.version.at);
    let customer = ctx.customer.as_str();
    let before = effects_on.then(|| registers.state(customer, &period, catalog));
    let mut notes = notes.to_vec();
    // An invoice whose lines name no known price takes its subscription's plan as read
    // (from the register, else as the provider showed it).
    let (effects, resolved, ungranted) =
        registers.plan_of_subscription(ctx, effects, catalog, shown);
    notes.extend(resolved);
    let mut changes = Vec::with_capacity(effects.len());
    let mut facts = Vec::new();
    for effect in &effects {
        let written = registers.apply(ctx, effect);
        if let Effect::Subscription { id, .. } = effect {
            match (reads, written.tied_with) {
                (false, Some(tie)) => notes.push(format!(
                    "same-second tie with event {tie} resolved by status rank"
                )),
                (true, tied) if ties_read.get(id) != Some(&tied) => return Err(TieMoved),
                _ => {}
            }
        }
        changes.push(written.change);
        facts.extend(written.fact);
    }
    let (status, reason) = outcome(&changes, &notes);
    let made = changes.iter().any(|c| matches!(c, Change::Made(_)));
    let told = match (before, made) {
        (Some(before), true) => Some(Told {
            facts,
            before,
            after: registers.state(customer, &period, catalog),
        }),
        _ => None,
    };
    Ok(Ruling {
        status,
        reason,
        told,
        ungranted,
    })
}

/// A tie a provider read settled that the registers no longer show as it was read: another
/// event of the same second was written since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TieMoved;

/// What the rules made of an event against the registers as read: its ruling.
pub struct Ruling {
    pub status: EventStatus,
    pub reason: String,
    /// With effects on and a change made, what its effects are told from.
    pub told: Option<Told>,
    /// A paid invoice was left without a plan: nothing told it (docs/design.md §6.2).
    pub ungranted: bool,
}

/// What the effects of an event's writes are told from (`effects::effects_of`): the facts
/// its register writes made, and the account's state before and after them.
pub struct Told {
    pub facts: Vec<Fact>,
    pub before: AccountState,
    pub after: AccountState,
}

/// Each subscription's same-second tie as the provider reads found it (the other event, if any).
pub type TiesRead = HashMap<String, Option<i64>>;

/// The event whose state the entitlement register `grant` holds stamped with this event's
/// provider time, if another event's. A register that holds the provider's word read once
/// that second had passed is settled already: what the provider showed then takes every
/// change of the second in (a replay of the other event of the tie reads nothing).
pub fn tie_on(ctx: &EventContext<'_>, registers: &Registers, grant: &str) -> Option<i64> {
    let at = Stamp::of(ctx, Rank(0)).at;
    let second_passed = Rank::confirmed(at + chrono::Duration::seconds(1));
    registers
        .entitlements
        .get(grant)
        .filter(|held| held.stamp.at == at && !held.is_of(ctx))
        .filter(|held| held.stamp.rank < second_passed.0)
        .map(|held| held.event_id)
}
