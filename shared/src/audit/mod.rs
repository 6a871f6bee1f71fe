//! The fold put to work (docs/design.md §4.11): an account's kept events read and decided,
//! folded by `billing::fold`, and then explained field by field (`why`, `--at`,
//! `--received-before`) or compared with the registers as stored (the audit: on demand, and
//! a bounded sample each scheduler run).
//!
//! - `fold_io`: the account read in one snapshot and folded; the registers compared with it;
//! - `why`: the fold explained field by field, and the plan's timeline through the events;
//! - `points`: the checked point an account's audit resumes the fold from;
//! - `run`: the audit over many accounts, the scheduler's and `inboxctl audit`'s;
//! - `credits`: Stripe-mirrored credit grants compared with Stripe's balance summaries.
//! - `differences`: the life of an audit's difference (recorded, seen again, resolved), the
//!   meter audit's and the credits audit's alike.

pub mod credits;
mod fold_io;
mod points;
mod run;
mod why;

pub use fold_io::{
    audit_account, audit_account_in_steps_of, fold_account, sources_of, AccountFold, AuditSource,
    Audited, Cut, Divergence, EventRef, FoldError, PlanStep, Sources,
};
pub use points::{checked_point, CheckedPoint};
pub use run::{audit_all, run, AuditReport, MAX_AUDITED_PER_RUN};
pub use why::{plan_timeline, why, Why, WhyField};
