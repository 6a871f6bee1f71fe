//! Notices in the worker (docs/design.md §6.2, §4.13): stored events that carry no billing
//! state of their own, as their provider's hook reads them ([`Provider::notice`]) — thin
//! events, generation failures, meter error notices. The worker asks the hook once; an event
//! it names no notice goes straight to the register rules, and a provider that sends none
//! never comes here. A notice is settled by reading: its read is stored as an event of its
//! own and applied in its place, or it is finished as decided without one.
//!
//! [`Provider::notice`]: crate::providers::Provider::notice

pub(super) mod health;
pub(super) mod meter_errors;
pub(super) mod thin;

use serde_json::Value;
use sqlx::PgConnection;

use super::{Applied, Applier, ApplyError, WorkerSource};
use crate::domain::EventStatus;
use crate::inbox::lease::Claimed;
use crate::providers::{self, Carrier, GenerationFailure, MeterErrorsNotice, Notice};

/// What a notice stands for.
pub(super) enum Carried {
    /// Decided without its object: finished with this status and reason.
    Finish(EventStatus, String),
    /// Applied as its read (`view`: the read's type, payload, customer, time and key under the
    /// notice's id and lease); `read_id` is the read's own row.
    Read { view: Claimed, read_id: i64 },
}

/// Applies the notice `event` (read as `notice`): what it stands for, read when no attempt
/// has yet, applied under its lease. A generation failure's sweep goes on until the
/// applier's sweep budget has passed (`health`).
pub(super) async fn apply(
    applier: &Applier<'_>,
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    notice: Notice,
) -> Result<Applied, ApplyError> {
    let carried = match notice {
        Notice::GenerationFailure(failure) if in_scope(event, source) => {
            health::carried_within(conn, event, source, &failure, applier.sweep_budget).await?
        }
        Notice::MeterErrors(errors) if in_scope(event, source) => {
            meter_errors::carried(conn, event, source, &errors).await?
        }
        // A thin event, or a notice of the other mode, which is ignored as a thin event is.
        Notice::Carrier(thin)
        | Notice::GenerationFailure(GenerationFailure { notice: thin, .. })
        | Notice::MeterErrors(MeterErrorsNotice { notice: thin, .. }) => {
            thin::carried(conn, event, source, &thin).await?
        }
    };
    apply_carried(applier, conn, event, source, carried).await
}

/// Applies, in `event`'s place, the read that settles its same-second tie (a Stripe summary's
/// list, docs/design.md §4.2): the read an attempt stored already, else one read now.
pub(super) async fn apply_tie_read(
    applier: &Applier<'_>,
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    carrier: &Carrier,
) -> Result<Applied, ApplyError> {
    let carried = thin::settled_by_read(conn, event, source, carrier).await?;
    apply_carried(applier, conn, event, source, carried).await
}

/// A notice as its read made it: finished as decided, or its read applied under the
/// notice's id and lease (the read's row finished after).
async fn apply_carried(
    applier: &Applier<'_>,
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    carried: Carried,
) -> Result<Applied, ApplyError> {
    match carried {
        Carried::Finish(status, reason) => super::finish(conn, event, status, reason, None).await,
        Carried::Read { view, read_id } => {
            let done = super::apply_event(applier, conn, &view, source).await?;
            thin::finish_read(conn, read_id, event.id).await;
            Ok(done)
        }
    }
}

/// Whether a claimed notice is in its source's scope (a notice of the other mode is the thin
/// events' to ignore).
fn in_scope(event: &Claimed, source: &WorkerSource) -> bool {
    let payload = event.payload.as_ref().unwrap_or(&Value::Null);
    providers::provider(source.kind)
        .out_of_scope(payload, source.livemode)
        .is_none()
}
