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

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::domain::meter::{MeterReport, TakeBack};
use crate::domain::retry::RetryPolicy;
use crate::platform::budget::Throttled;
use crate::platform::config::SourceConfig;
use crate::platform::sim::Point;
use crate::providers::meter::{Dedupe, Meter, Sent};
use crate::providers::{provider, Api, ApiClient};
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
    /// Each source's meter, its calls through `client` (the dispatcher's take from the meter
    /// reports' share of their source's budget, docs/design.md §6.7).
    pub fn build(configs: &[SourceConfig], client: impl Into<ApiClient>) -> Self {
        let client = client.into();
        let mut meters = HashMap::new();
        for config in configs {
            let Some(name) = config.meter.as_ref().and_then(|m| m.name()) else {
                continue;
            };
            let Some(api) = Api::for_source(config, &client) else {
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
#[tracing::instrument(name = "meter send", skip_all, fields(report_id = id, source, account))]
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
    let span = tracing::Span::current();
    span.record("source", claimed.report.source.as_str());
    span.record("account", claimed.report.customer.as_str());
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
        | Outcome::Withdrawn(error)
        | Outcome::Waits(error) => Reported::Failed { status, error },
        Outcome::Throttled(throttled) => Reported::Failed {
            status,
            error: throttled.to_string(),
        },
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
    if report.unanswered && !resend_is_deduped(meter.dedupe(), report.first_sent_at, claimed.now) {
        match read_back(pool, meter.as_ref(), report, claimed.now).await? {
            ReadBack::Held => return Ok(Outcome::Taken),
            ReadBack::NotHeld => {}
            ReadBack::Waits(why) => return Ok(Outcome::Waits(why)),
            ReadBack::Operator(why) => return Ok(Outcome::Refused(why)),
            ReadBack::Unreadable(why) => return Ok(Outcome::NotTaken(why)),
            ReadBack::Throttled(throttled) => return Ok(Outcome::Throttled(throttled)),
        }
    }
    Ok(sent(meter.send(report).await))
}

/// What a read-back found of a report whose send went unanswered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ReadBack {
    Held,
    NotHeld,
    /// Not decided yet: another report of the minute may settle it.
    Waits(String),
    /// Not decided, and nothing here will decide it: for an operator, with both totals.
    Operator(String),
    /// The provider could not be read (tried again later).
    Unreadable(String),
    /// Not read for the rate (tried again from the time said, not an attempt).
    Throttled(Throttled),
}

/// Reads the report back (docs/design.md §4.13): the provider's total of its minute is
/// explained with the other reports of that minute. Those the provider surely counts (sent a
/// while ago) are taken out; those it may or may not count yet (on their way, unanswered,
/// dead where it may hold them, sent too recently to be in its total) are each in it or not;
/// those it never took (withdrawn, dead without a send that may have reached it) are not.
/// The report is held, or not, when every way of making up the total agrees on it; else it
/// waits while another report of the minute can settle by itself, and goes to an operator
/// otherwise. A minute's total is never credited to whichever report asks first.
async fn read_back(
    pool: &PgPool,
    meter: &dyn Meter,
    report: &MeterReport,
    now: DateTime<Utc>,
) -> Result<ReadBack, sqlx::Error> {
    let others = outbox::minute_others(pool, report).await?;
    let minute: Vec<(Place, &outbox::MinuteOther)> = others
        .iter()
        .map(|o| (place(o, meter.dedupe(), now), o))
        .collect();
    let total = match meter.minute_total(report).await {
        Ok(Some(total)) => total,
        Ok(None) => {
            return Ok(ReadBack::Unreadable(
                "an earlier send went unanswered and the provider can neither dedupe a \
                 resend nor be read back: not sent again (replay with --not-held once the \
                 provider is seen not to hold it)"
                    .to_owned(),
            ))
        }
        Err(error) => {
            return Ok(match Throttled::find(&error) {
                Some(throttled) => ReadBack::Throttled(throttled.clone()),
                None => ReadBack::Unreadable(format!("read-back: {error:#}")),
            })
        }
    };
    let counted: i64 = minute
        .iter()
        .filter(|(p, _)| *p == Place::Counted)
        .map(|(_, o)| o.value)
        .sum();
    let maybe: Vec<i64> = minute
        .iter()
        .filter(|(p, _)| matches!(p, Place::Maybe { .. }))
        .map(|(_, o)| o.value)
        .collect();
    let verdict = explain(total - counted as f64, report.value, &maybe);
    let settles = minute
        .iter()
        .any(|(p, _)| *p == Place::Maybe { settles: true });
    let named: Vec<String> = minute
        .iter()
        .filter(|(p, _)| matches!(p, Place::Maybe { .. }))
        .map(|(_, o)| format!("{} ({})", o.id, o.value))
        .collect();
    let said = || {
        format!(
            "the provider counts {total} in the report's minute; this store's reports there: \
             {counted} it surely took, this one ({}), and {} it may hold",
            report.value,
            if named.is_empty() {
                "none other".to_owned()
            } else {
                named.join(", ")
            }
        )
    };
    Ok(match verdict {
        Explained::Held => ReadBack::Held,
        Explained::NotHeld => ReadBack::NotHeld,
        Explained::Either if settles => ReadBack::Waits(format!(
            "waits for the other reports of its minute to settle: {}",
            said()
        )),
        Explained::Either => ReadBack::Operator(format!(
            "read-back cannot tell whether the provider holds it: {}; check the provider, \
             then replay (with --not-held if it is not there)",
            said()
        )),
        Explained::Neither if settles => ReadBack::Waits(format!(
            "waits for the other reports of its minute to settle: {}",
            said()
        )),
        Explained::Neither => ReadBack::Operator(format!(
            "read-back: no choice of this store's reports makes up the provider's total: {}; \
             check the provider, then replay (with --not-held if it is not there)",
            said()
        )),
    })
}

/// Where another report of the minute stands in the provider's total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Surely in it: taken, long enough ago for the provider's summaries to count it.
    Counted,
    /// Surely not: never taken (withdrawn, or dead without a send that may have reached it).
    Absent,
    /// In it or not; `settles`: it will be known without an operator (on its way and sent
    /// without a read-back, or taken too recently to be counted yet).
    Maybe { settles: bool },
}

/// Where `other` stands now.
fn place(other: &outbox::MinuteOther, dedupe: Dedupe, now: DateTime<Utc>) -> Place {
    let settle = chrono::Duration::from_std(audit::SETTLE).unwrap_or_default();
    match other.status {
        ReportStatus::Withdrawn => Place::Absent,
        ReportStatus::Sent => match other.sent_at {
            Some(at) if at + settle <= now => Place::Counted,
            _ => Place::Maybe { settles: true },
        },
        ReportStatus::Dead if other.unanswered || other.sent_at.is_some() => {
            Place::Maybe { settles: false }
        }
        ReportStatus::Dead => Place::Absent,
        // On its way: it is sent without a read-back, unless it is one to read back too.
        ReportStatus::Pending => Place::Maybe {
            settles: !other.unanswered || resend_is_deduped(dedupe, other.first_sent_at, now),
        },
    }
}

/// How a total is made up of the reports that may be in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Explained {
    /// Every way of making it up has the report in it.
    Held,
    /// None has.
    NotHeld,
    /// Some have and some have not.
    Either,
    /// No way makes it up.
    Neither,
}

/// The reports that may be in it, at most: past this, a read-back goes to an operator.
const MAX_MAYBE: usize = 16;

/// Which choices of `maybe` (each in the total or not), beside the report of `value` or
/// without it, make up `total` (what the provider counts beyond the reports it surely does).
fn explain(total: f64, value: i64, maybe: &[i64]) -> Explained {
    if maybe.len() > MAX_MAYBE {
        return Explained::Neither;
    }
    let mut sums = std::collections::BTreeSet::new();
    for mask in 0u32..(1 << maybe.len()) {
        let sum: i64 = maybe
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, v)| v)
            .sum();
        sums.insert(sum);
    }
    let makes = |extra: i64| {
        sums.iter()
            .any(|s| ((s + extra) as f64 - total).abs() < 1e-6)
    };
    match (makes(value), makes(0)) {
        (true, false) => Explained::Held,
        (false, true) => Explained::NotHeld,
        (true, true) => Explained::Either,
        (false, false) => Explained::Neither,
    }
}

/// One attempt at a correction (docs/design.md §4.13): it waits while the report it corrects
/// is on its way (not an attempt: it is armed again when that report settles); it has
/// nothing to take back when that report never reached the provider; it gives up to an
/// operator when that report died where the provider may hold it. Else it takes the report
/// back by the provider's adjustment while the provider's window for it lasts (counted from
/// the report's first send, which its receipt can only follow), by a compensating report
/// otherwise, the way chosen at each attempt until one may have reached the provider: from
/// then on every attempt is the same request. An unanswered correction is resent only within
/// the provider's window: a correction is not read back.
async fn correct(
    pool: &PgPool,
    meters: &Meters,
    claimed: &Claimed,
    corrected: &outbox::Corrected,
) -> Result<Outcome, sqlx::Error> {
    match (corrected.status, corrected.maybe_held) {
        (ReportStatus::Sent, _) => {}
        (ReportStatus::Pending, _) => {
            return Ok(Outcome::Waits(format!(
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
                 provider, then replay the report (with --not-held if it is not there); once \
                 it is sent this correction is armed again",
                corrected.id
            )))
        }
    }
    let report = &claimed.report;
    let Some(meter) = meters.0.get(&report.source).map(|m| &m.meter) else {
        return Ok(no_meter(report));
    };
    if report.unanswered && !resend_is_deduped(meter.dedupe(), report.first_sent_at, claimed.now) {
        return Ok(Outcome::NotTaken(
            "an earlier send of this correction went unanswered and the provider's dedupe \
             window for it has passed; a correction is not read back: not sent again (check \
             the provider, then replay with --not-held)"
                .to_owned(),
        ));
    }
    let cancel_now = meter.cancel_window().is_some_and(|window| {
        resend_is_deduped(Dedupe::Within(window), corrected.first_sent_at, claimed.now)
    });
    let how = match (&corrected.how, report.unanswered) {
        // An earlier attempt may have landed: the same request again, or an operator.
        (Some(how), true) => {
            if how == "cancel" && !cancel_now {
                return Ok(Outcome::Refused(format!(
                    "an earlier cancel of {} went unanswered and the provider's window for a \
                     cancel has passed: not sent again (check whether the provider cancelled \
                     it; if not, replay with --not-held, which sends a compensating report)",
                    corrected.id
                )));
            }
            how.clone()
        }
        _ => {
            let chosen = if cancel_now { "cancel" } else { "compensate" };
            outbox::keep_how(pool, claimed, chosen).await?;
            chosen.to_owned()
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
        Sent::Throttled(throttled) => Outcome::Throttled(throttled),
    }
}

/// Whether a resend at `now` is taken by the provider as the report it may hold already.
/// `now` and `first_sent_at` are the store's clock (`inbox_now()`): the one the row was written
/// on, so the provider's window is measured as it ran for the row, wherever the machine's
/// clock stands.
fn resend_is_deduped(
    dedupe: Dedupe,
    first_sent_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> bool {
    match dedupe {
        Dedupe::Always => true,
        Dedupe::Never => false,
        Dedupe::Within(window) => first_sent_at.is_some_and(|first| {
            let trusted = window.saturating_sub(WINDOW_MARGIN);
            now < first + chrono::Duration::from_std(trusted).unwrap_or_default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_is_trusted_only_inside_the_providers_window_on_the_stores_clock() {
        let day = Duration::from_secs(24 * 3600);
        // The store's time, years ahead of the machine's (a simulation's): the window is read
        // on it.
        let now = "2031-01-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap();
        let ago = |d: chrono::Duration| Some(now - d);
        let deduped = |dedupe, first| resend_is_deduped(dedupe, first, now);
        assert!(deduped(Dedupe::Always, ago(chrono::Duration::days(30))));
        assert!(!deduped(Dedupe::Never, Some(now)));
        assert!(deduped(
            Dedupe::Within(day),
            ago(chrono::Duration::hours(1))
        ));
        assert!(
            !deduped(
                Dedupe::Within(day),
                ago(chrono::Duration::hours(23) + chrono::Duration::minutes(1))
            ),
            "within the last hour of the window, the report is read back"
        );
        assert!(!deduped(
            Dedupe::Within(day),
            ago(chrono::Duration::hours(25))
        ));
        assert!(!deduped(Dedupe::Within(day), None));
    }

    #[test]
    fn a_minutes_total_is_credited_only_when_every_way_of_making_it_up_agrees() {
        // Alone in its minute: the total is the report, or nothing.
        assert_eq!(explain(4.0, 4, &[]), Explained::Held);
        assert_eq!(explain(0.0, 4, &[]), Explained::NotHeld);
        assert_eq!(explain(7.0, 4, &[]), Explained::Neither);
        // 3 (this) and 5 unsettled, Stripe at 5: the 5 is there, this is not.
        assert_eq!(explain(5.0, 3, &[5]), Explained::NotHeld);
        assert_eq!(explain(5.0, 5, &[3]), Explained::Held);
        assert_eq!(explain(8.0, 5, &[3]), Explained::Held);
        // Two of 3, Stripe at 3: either one.
        assert_eq!(explain(3.0, 3, &[3]), Explained::Either);
        // A correction in the minute counts its negative value.
        assert_eq!(explain(0.0, 3, &[-3]), Explained::Either);
        assert_eq!(explain(3.0, 3, &[-2]), Explained::Held);
        assert_eq!(
            explain(1.0, 1, &[1; MAX_MAYBE + 1]),
            Explained::Neither,
            "too many to tell: an operator's"
        );
    }

    #[test]
    fn a_report_of_the_minute_is_counted_only_once_the_provider_surely_counts_it() {
        let now = Utc::now();
        let day = Dedupe::Within(Duration::from_secs(24 * 3600));
        let other =
            |status, unanswered, sent_ago: Option<i64>, first_ago: i64| outbox::MinuteOther {
                id: "mrp_x".into(),
                value: 1,
                status,
                first_sent_at: Some(now - chrono::Duration::hours(first_ago)),
                unanswered,
                sent_at: sent_ago.map(|m| now - chrono::Duration::minutes(m)),
            };
        assert_eq!(
            place(&other(ReportStatus::Sent, false, Some(60), 1), day, now),
            Place::Counted
        );
        assert_eq!(
            place(&other(ReportStatus::Sent, false, Some(1), 1), day, now),
            Place::Maybe { settles: true },
            "taken a minute ago: the summaries may not count it yet"
        );
        assert_eq!(
            place(&other(ReportStatus::Withdrawn, false, None, 1), day, now),
            Place::Absent
        );
        assert_eq!(
            place(&other(ReportStatus::Dead, false, None, 1), day, now),
            Place::Absent
        );
        assert_eq!(
            place(&other(ReportStatus::Dead, true, None, 1), day, now),
            Place::Maybe { settles: false }
        );
        assert_eq!(
            place(&other(ReportStatus::Pending, false, None, 1), day, now),
            Place::Maybe { settles: true }
        );
        assert_eq!(
            place(&other(ReportStatus::Pending, true, None, 1), day, now),
            Place::Maybe { settles: true },
            "resent under its identifier within the window"
        );
        assert_eq!(
            place(&other(ReportStatus::Pending, true, None, 25), day, now),
            Place::Maybe { settles: false },
            "read back too"
        );
    }
}
