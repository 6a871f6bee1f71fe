//! Billing: the pure model (effects, versions, grants, outcomes, the derived plan), the
//! register rules (plain functions over an account's registers as read), the
//! register SQL that reads them, and the account view operators read (docs/design.md §4). Which effects an
//! event asks for is each provider's `decide` (under `providers/`); this layer knows no
//! provider.

pub mod account;
pub mod credits;
pub mod credits_read;
pub mod fold;
pub mod model;
pub mod registers;
pub mod rules;
pub mod ruling;
pub mod usage;

pub use model::{
    derive_plan, outcome, status_entitles, AccountState, Change, Decided, Decision, Effect,
    EventContext, Fact, PaymentStatus, Problem, Rank, Resolved, Settled, StateInputs,
    SubscriptionEnds, SubscriptionState, Version, Written, FREE,
};
