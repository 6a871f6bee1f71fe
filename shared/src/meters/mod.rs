//! Meter reports (docs/design.md §4.13): every accepted debit of a source with a meter is
//! told to the provider's meter once. The report is written with the debit (`inbox_debit`),
//! so a crash can lose neither; it is sent after the commit by the dispatcher, here: claimed,
//! sent through its provider's [`Meter`], recorded. A send that went unanswered may have
//! reached the provider: the next one resends under the report's dedupe key while the
//! provider dedupes it, and otherwise reads the report back first — never a blind second
//! send. **outbox** holds the row's life, **audit** compares what was sent with what the
//! provider's meter counts (§4.13a).

pub mod audit;
pub mod outbox;

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use sqlx::PgPool;

use crate::domain::meter::{MeterReport, TakeBack};
use crate::domain::retry::RetryPolicy;
use crate::platform::config::SourceConfig;
use crate::platform::sim::Point;
use crate::providers::meter::{Dedupe, Meter, Sent};
use crate::providers::{provider, Api};
use outbox::{Claimed, Outcome, ReportStatus};

/// How long one request to a provider's meter may take (a send, a read-back's page).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// A resend under the dedupe key is trusted only this long before the provider's window ends,
/// counted from the first send (which the provider's receipt can only follow).
const WINDOW_MARGIN: Duration = Duration::from_secs(3600);

/// Each source's meter, by source name: the sources with a `meter` and an API key.
#[derive(Default)]
pub struct Meters(HashMap<String, SourceMeter>);

/// One source's meter, with its name there (the `meter` its reports carry).
struct SourceMeter {
    name: String,
    meter: Box<dyn Meter>,
}

impl Meters {
    pub fn build(configs: &[SourceConfig], http: &reqwest::Client) -> Self {
        let mut meters = HashMap::new();
        for config in configs {
            let Some(name) = config.meter.as_ref().and_then(|m| m.name()) else {
                continue;
            };
            let Some(api) = Api::for_source(config, http) else {
                continue;
            };
            if let Some(meter) = provider(config.kind).meter(api, name) {
                let name = name.to_owned();
                meters.insert(config.name.clone(), SourceMeter { name, meter });
            }
        }
        Self(meters)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each source's name, its meter's name and its meter, by source name.
    pub fn each(&self) -> impl Iterator<Item = (&str, &str, &dyn Meter)> {
        let mut each: Vec<_> = self
            .0
            .iter()
            .map(|(source, m)| (source.as_str(), m.name.as_str(), m.meter.as_ref()))
            .collect();
        each.sort_by_key(|(source, _, _)| *source);
        each.into_iter()
    }
}

/// Meters built elsewhere (a simulation's, a bench's): each source's name, its meter's name
/// there, and the meter.
impl FromIterator<(String, String, Box<dyn Meter>)> for Meters {
    fn from_iter<I: IntoIterator<Item = (String, String, Box<dyn Meter>)>>(iter: I) -> Self {
        Self(
            iter.into_iter()
                .map(|(source, name, meter)| (source, SourceMeter { name, meter }))
                .collect(),
        )
    }
}

/// A report's number at a simulation's points: the first 60 bits of its id's hex digits.
fn point_id(id: &str) -> i64 {
    id.get(4..19)
        .and_then(|hex| i64::from_str_radix(hex, 16).ok())
        .unwrap_or_default()
}

/// What became of one message naming a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// The provider holds it now.
    Sent,
    /// Not sent this time: retried later (`pending`) or not any more (`dead`).
    Failed { status: ReportStatus, error: String },
    /// Nothing to do: sent or dead, held by another dispatcher, not due, or gone.
    Skipped,
}

/// Sends one report: claim, send (or read back first), record. An error means the database
/// could not be reached; every provider failure is recorded on the report.
#[tracing::instrument(skip_all, fields(report_id = id))]
pub async fn send(
    pool: &PgPool,
    meters: &Meters,
    id: &str,
    lease: Duration,
    retry: &RetryPolicy,
) -> Result<Reported, sqlx::Error> {
    let Some(claimed) = outbox::claim(pool, id, lease).await? else {
        return Ok(Reported::Skipped);
    };
    let outcome = match &claimed.corrects {
        Some(corrected) => correct(pool, meters, &claimed, corrected).await?,
        None => attempt(pool, meters, &claimed).await?,
    };
    crate::platform::sim::point(Point::MeterAttempted, point_id(&claimed.report.id)).await;
    let status = outbox::record(pool, &claimed, &outcome, retry).await?;
    Ok(match outcome {
        Outcome::Taken => {
            tracing::info!(report_id = %claimed.report.id, source = %claimed.report.source, "meter report sent");
            Reported::Sent
        }
        Outcome::Refused(error)
        | Outcome::NotTaken(error)
        | Outcome::Unanswered(error)
        | Outcome::Withdrawn(error) => Reported::Failed { status, error },
    })
}

/// One attempt at the provider.
async fn attempt(
    pool: &PgPool,
    meters: &Meters,
    claimed: &Claimed,
) -> Result<Outcome, sqlx::Error> {
    let report = &claimed.report;
    let Some(meter) = meters.0.get(&report.source).map(|m| &m.meter) else {
        return Ok(no_meter(report));
    };
    if report.unanswered && !resend_is_deduped(meter.dedupe(), report.first_sent_at) {
        let others = outbox::others_in_minute(pool, report).await?;
        match meter.holds(report, others).await {
            Ok(Some(true)) => return Ok(Outcome::Taken),
            Ok(Some(false)) => {}
            Ok(None) => {
                return Ok(Outcome::NotTaken(
                    "an earlier send went unanswered and the provider can neither dedupe a \
                     resend nor be read back: not sent again (replay with --not-held once \
                     the provider is seen not to hold it)"
                        .to_owned(),
                ))
            }
            Err(error) => return Ok(Outcome::NotTaken(format!("read-back: {error:#}"))),
        }
    }
    Ok(sent(meter.send(report).await))
}

/// One attempt at a correction (docs/design.md §4.13): it waits while the report it corrects
/// is on its way; it has nothing to take back when that report never reached the provider;
/// it gives up to an operator when that report died where the provider may hold it. Else it
/// takes the report back by the provider's adjustment while the provider's window for it
/// lasts (counted from the report's first send, which its receipt can only follow), by a
/// compensating report otherwise; the way is chosen once and kept. An unanswered correction
/// is resent only under its dedupe key, within the provider's window: a correction is not
/// read back.
async fn correct(
    pool: &PgPool,
    meters: &Meters,
    claimed: &Claimed,
    corrected: &outbox::Corrected,
) -> Result<Outcome, sqlx::Error> {
    match (corrected.status, corrected.maybe_held) {
        (ReportStatus::Sent, _) => {}
        (ReportStatus::Pending, _) => {
            return Ok(Outcome::NotTaken(format!(
                "waits for the report it corrects, {}, to be settled",
                corrected.id
            )))
        }
        (ReportStatus::Dead | ReportStatus::Withdrawn, false) => {
            return Ok(Outcome::Withdrawn(format!(
                "the report it corrects, {}, never reached the provider",
                corrected.id
            )))
        }
        (ReportStatus::Dead | ReportStatus::Withdrawn, true) => {
            return Ok(Outcome::Refused(format!(
                "the report it corrects, {}, is dead and the provider may hold it: check the \
                 provider, then replay both (the report with --not-held if it is not there)",
                corrected.id
            )))
        }
    }
    let report = &claimed.report;
    let Some(meter) = meters.0.get(&report.source).map(|m| &m.meter) else {
        return Ok(no_meter(report));
    };
    if report.unanswered && !resend_is_deduped(meter.dedupe(), report.first_sent_at) {
        return Ok(Outcome::NotTaken(
            "an earlier send of this correction went unanswered and the provider's dedupe \
             window for it has passed; a correction is not read back: not sent again (check \
             the provider, then replay with --not-held)"
                .to_owned(),
        ));
    }
    let how = match &corrected.how {
        Some(how) => how.clone(),
        None => {
            let cancel = meter.cancel_window().is_some_and(|window| {
                resend_is_deduped(Dedupe::Within(window), corrected.first_sent_at)
            });
            let chosen = if cancel { "cancel" } else { "compensate" };
            outbox::keep_how(pool, claimed, chosen).await?
        }
    };
    let take_back = match how.as_str() {
        "cancel" => TakeBack::Cancel {
            identifier: corrected.identifier.clone(),
        },
        _ => TakeBack::Compensate,
    };
    let correction = MeterReport {
        take_back: Some(take_back),
        ..report.clone()
    };
    Ok(sent(meter.send(&correction).await))
}

/// A report of a source with no meter here.
fn no_meter(report: &MeterReport) -> Outcome {
    Outcome::NotTaken(format!(
        "source '{}' has no meter (or no API key) configured here",
        report.source
    ))
}

/// A send's answer as it is recorded.
fn sent(sent: Sent) -> Outcome {
    match sent {
        Sent::Taken => Outcome::Taken,
        Sent::Refused(e) => Outcome::Refused(e),
        Sent::NotTaken(e) => Outcome::NotTaken(e),
        Sent::Unanswered(e) => Outcome::Unanswered(e),
    }
}

/// Whether a resend now is taken by the provider as the report it may hold already.
fn resend_is_deduped(dedupe: Dedupe, first_sent_at: Option<chrono::DateTime<Utc>>) -> bool {
    match dedupe {
        Dedupe::Always => true,
        Dedupe::Never => false,
        Dedupe::Within(window) => first_sent_at.is_some_and(|first| {
            let trusted = window.saturating_sub(WINDOW_MARGIN);
            Utc::now() < first + chrono::Duration::from_std(trusted).unwrap_or_default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_is_trusted_only_inside_the_providers_window() {
        let day = Duration::from_secs(24 * 3600);
        let now = Utc::now();
        assert!(resend_is_deduped(
            Dedupe::Always,
            Some(now - chrono::Duration::days(30))
        ));
        assert!(!resend_is_deduped(Dedupe::Never, Some(now)));
        assert!(resend_is_deduped(
            Dedupe::Within(day),
            Some(now - chrono::Duration::hours(1))
        ));
        assert!(
            !resend_is_deduped(
                Dedupe::Within(day),
                Some(now - chrono::Duration::hours(23) - chrono::Duration::minutes(1))
            ),
            "within the last hour of the window, the report is read back"
        );
        assert!(!resend_is_deduped(
            Dedupe::Within(day),
            Some(now - chrono::Duration::hours(25))
        ));
        assert!(!resend_is_deduped(Dedupe::Within(day), None));
    }
}
