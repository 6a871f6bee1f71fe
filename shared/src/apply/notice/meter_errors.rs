//! A provider's notice that meter reports it took could not be counted, in the worker
//! (docs/design.md §4.13; Stripe's `v1.billing.meter.error_report_triggered` and
//! `v1.billing.meter.no_meter_found`). What it says is told by the notice or read from the
//! provider (`Reads::meter_errors`); the reports it names by identifier are marked with the
//! provider's reason and made dead, for an operator to see and replay once the cause is fixed,
//! and `MeterErrorReports` counts the errors per source, which an alarm watches. A report sent
//! again after the notice's time (an operator fixed the cause and replayed it) is not marked:
//! the notice, replayed, speaks only of the sends before it. The notice is about no account:
//! it finishes as applied, or ignored when it names none of this store's reports.

use chrono::Utc;
use serde_json::{json, Value};
use sqlx::PgConnection;

use super::Carried;
use crate::apply::{ApplyError, WorkerSource};
use crate::domain::EventStatus;
use crate::inbox::lease::Claimed;
use crate::meters::outbox;
use crate::providers::MeterErrorsNotice;

pub(super) async fn carried(
    conn: &mut PgConnection,
    event: &Claimed,
    source: &WorkerSource,
    notice: &MeterErrorsNotice,
) -> Result<Carried, ApplyError> {
    let said = match (&notice.told, &source.reads) {
        (Some(told), _) => told.clone(),
        (None, Some(reads)) => reads
            .meter_errors(&notice.notice)
            .await
            .map_err(ApplyError::fetch)?,
        (None, None) => {
            return Ok(Carried::Finish(
                EventStatus::Unprocessable,
                format!(
                    "the provider could not count meter reports; source '{}' needs an API key (api_key or api_key_secret_id) to read which",
                    event.source
                ),
            ))
        }
    };
    let notice_at = event.occurred_at.as_ref().map(|t| t.as_datetime());
    let marked =
        outbox::mark_provider_errors(conn, &event.source, &said.samples, notice_at).await?;
    crate::platform::metrics::emit(meter_errors_metric(
        &event.source,
        said.error_count,
        Utc::now(),
    ));
    let (status, named) = match marked.len() {
        0 => (
            EventStatus::Ignored,
            "none of them this store's, or sent again since".to_owned(),
        ),
        n => (
            EventStatus::Applied,
            format!("{n} marked dead: {}", marked.join(", ")),
        ),
    };
    Ok(Carried::Finish(
        status,
        format!(
            "{} meter report(s) could not be counted ({}); samples {}",
            said.error_count, said.summary, named
        ),
    ))
}

/// The EMF line of one notice: `MeterErrorReports` by `Stack` and `Source`, the reports the
/// provider says it could not count.
pub fn meter_errors_metric(source: &str, count: i64, now: chrono::DateTime<Utc>) -> Value {
    let mut line =
        crate::platform::metrics::document(now, &[&["Source"]], &[("MeterErrorReports", "Count")]);
    line["Source"] = json!(source);
    line["MeterErrorReports"] = json!(count);
    line
}
