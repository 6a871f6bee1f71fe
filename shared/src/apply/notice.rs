//! Notices in the worker (docs/design.md §6.2, §4.13): stored events that carry no billing
//! state of their own, as their provider's hook reads them — thin events, generation
//! failures, meter error notices.

pub(super) mod health;
pub(super) mod meter_errors;
pub(super) mod thin;
