//! A debit told to Polar's meters (docs/design.md §4.13): `POST /v1/events/ingest` with one
//! event, `{name, customer_id, external_id, timestamp, metadata: {value}}` — `name` the
//! source's `meter.event_name`, `customer_id` the account's Polar customer, `external_id` the
//! report's identifier (Polar keeps one event per organization and `external_id`, with no time
//! window, and answers a repeat with `duplicates: 1`: a resend is always harmless) and
//! `metadata.value` the amount as a number, which a meter aggregating
//! `{"func": "sum", "property": "value"}` adds up.
//!
//! A correction (a reversed debit's) is a compensating event of the negative value under its
//! own `external_id`: Polar documents no adjustment of an ingested event, and a meter that sums
//! `value` adds it.
//!
//! Polar refuses a `timestamp` in its future ("Timestamp must be in the past.", 422): a
//! report timed by a clock ahead of Polar's is sent again later, not dead.
//!
//! The meter audit (docs/design.md §4.13a) reads the total from the meter that counts exactly
//! these events: found in `GET /v1/meters/` as one whose filter is the single clause `name eq
//! <event name>` and whose aggregation is `sum` of `value` (any two such meters count the same
//! events the same way); none, and the audit does not compare. Its total is read from `GET
//! /v1/meters/{id}/quantities`, whose buckets are whole UTC hours or days counted in full:
//! whole days, then whole hours, so a window on whole hours is read exactly.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde_json::{json, Value};

use crate::domain::meter::MeterReport;
use crate::domain::CustomerId;
use crate::providers::meter::{answer, Dedupe, Meter, Sent};
use crate::providers::{path_id, Api};
use crate::BoxFuture;

/// Polar's longest event `name`.
pub const MAX_EVENT_NAME: usize = 128;

/// How long a meter list without this source's meter is believed before it is read again.
const LOOK_AGAIN: Duration = Duration::from_secs(10 * 60);

/// Polar's largest page (`API_PAGINATION_MAX_LIMIT`).
const PAGE: u32 = 100;

/// What the meter list said of this source's meter.
enum Found {
    Meter(String),
    None(Instant),
}

pub struct PolarMeter {
    api: Api,
    event_name: String,
    /// The meter that counts this source's events, found once by its filter.
    meter: Mutex<Option<Found>>,
}

impl PolarMeter {
    pub fn new(api: Api, event_name: &str) -> Self {
        Self {
            api,
            event_name: event_name.to_owned(),
            meter: Mutex::new(None),
        }
    }

    async fn post(&self, report: &MeterReport) -> Sent {
        let key = match self.api.key.get().await {
            Ok(key) => key,
            Err(error) => return Sent::NotTaken(format!("no API key: {error:#}")),
        };
        let request = self
            .api
            .http
            .post(format!("{}/v1/events/ingest", self.api.base_url))
            .bearer_auth(key)
            .json(&body(&self.event_name, report));
        answer(self.api.send(request).await, clock_behind).await
    }

    /// The id of the meter that counts this source's events (see [`counts_reports`]): `None`,
    /// logged, when Polar has none.
    async fn meter_id(&self) -> anyhow::Result<Option<String>> {
        match &*self.meter.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(Found::Meter(id)) => return Ok(Some(id.clone())),
            Some(Found::None(at)) if at.elapsed() < LOOK_AGAIN => return Ok(None),
            _ => {}
        }
        let mut meters = Vec::new();
        let mut page = 1;
        loop {
            let query = [
                ("page", page.to_string()),
                ("limit", PAGE.to_string()),
                ("sorting", "created_at".to_owned()),
            ];
            let answer = self
                .api
                .get_found("/v1/meters/", &query, &[])
                .await?
                .context("GET /v1/meters/ answered 404 Not Found")?;
            let items = answer
                .get("items")
                .and_then(Value::as_array)
                .context("GET /v1/meters/ answered no `items`")?;
            meters.extend(items.iter().cloned());
            let last = answer
                .pointer("/pagination/max_page")
                .and_then(Value::as_u64)
                .unwrap_or_default();
            if items.is_empty() || page >= last {
                break;
            }
            page += 1;
        }
        let found = chosen(&meters, &self.event_name).map(str::to_owned);
        if found.is_none() {
            tracing::warn!(
                event_name = %self.event_name,
                "no Polar meter sums `value` over exactly the events of this name \
                 (filter `name eq`, aggregation `sum` of `value`): the meter audit does not compare"
            );
        }
        *self.meter.lock().unwrap_or_else(|e| e.into_inner()) = Some(match &found {
            Some(id) => Found::Meter(id.clone()),
            None => Found::None(Instant::now()),
        });
        Ok(found)
    }

    /// The meter's total for the customer over `[start, end)`, read exactly (see [`reads`]);
    /// `None`, logged, when the window cannot be read exactly or Polar has no such meter.
    async fn summed(
        &self,
        customer: &CustomerId,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> anyhow::Result<Option<f64>> {
        let Some(reads) = reads(start, end) else {
            tracing::warn!(event_name = %self.event_name, %start, %end,
                "Polar's quantities read whole UTC hours over at most 366 days: not compared");
            return Ok(None);
        };
        if reads.is_empty() {
            return Ok(Some(0.0));
        }
        let Some(meter) = self.meter_id().await? else {
            return Ok(None);
        };
        let path = format!("/v1/meters/{}/quantities", path_id(&meter)?);
        let mut total = 0.0;
        for read in reads {
            let Some(answer) = self
                .api
                .get_found(&path, &read.query(customer), &[])
                .await?
            else {
                // Gone from the organization: looked up again next time.
                *self.meter.lock().unwrap_or_else(|e| e.into_inner()) = None;
                anyhow::bail!("GET {path} answered 404 Not Found");
            };
            total += read.total(&answer).with_context(|| format!("GET {path}"))?;
        }
        Ok(Some(total))
    }
}

/// The meter of `meters` (Polar's `Meter` schema) that counts exactly the reports of
/// `event_name` ([`counts_reports`]), an active one first; `None` when none does.
fn chosen<'a>(meters: &'a [Value], event_name: &str) -> Option<&'a str> {
    let mut counting: Vec<&Value> = meters
        .iter()
        .filter(|m| counts_reports(m, event_name))
        .collect();
    // Every such meter counts the same total; an archived one is as good, but an active one
    // is the one an operator looks at.
    counting.sort_by_key(|m| !m.get("archived_at").is_none_or(Value::is_null));
    counting.first()?.get("id")?.as_str()
}

/// Whether a meter sums, over a customer's events, exactly what this source reports: its
/// filter is one clause, `name eq <event_name>` (a second clause or a nested filter could
/// leave reports out, another operator take others in), and its aggregation the `sum` of
/// `value` (`metadata.value`; Polar keeps the property without its `metadata.` prefix).
fn counts_reports(meter: &Value, event_name: &str) -> bool {
    let clauses = meter
        .pointer("/filter/clauses")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let selects = match clauses {
        [clause] => {
            clause.get("property").and_then(Value::as_str) == Some("name")
                && clause.get("operator").and_then(Value::as_str) == Some("eq")
                && clause.get("value").and_then(Value::as_str) == Some(event_name)
        }
        _ => false,
    };
    let sums = meter.pointer("/aggregation/func").and_then(Value::as_str) == Some("sum")
        && meter
            .pointer("/aggregation/property")
            .and_then(Value::as_str)
            == Some("value");
    selects && sums
}

/// One quantities read: the buckets of `interval` from `first` to `last` (each bucket's
/// start), each counted in full.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Read {
    first: DateTime<Utc>,
    last: DateTime<Utc>,
    interval: Interval,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interval {
    Hour,
    Day,
}

impl Interval {
    fn step(self) -> TimeDelta {
        match self {
            Interval::Hour => TimeDelta::hours(1),
            Interval::Day => TimeDelta::days(1),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Interval::Hour => "hour",
            Interval::Day => "day",
        }
    }
}

impl Read {
    /// The buckets covering `[from, to)`, both on the interval's step.
    fn over(from: DateTime<Utc>, to: DateTime<Utc>, interval: Interval) -> Self {
        Self {
            first: from,
            last: to - interval.step(),
            interval,
        }
    }

    /// Polar's quantities series runs from `start_timestamp` to `end_timestamp` included,
    /// a bucket at each step (`generate_series`), each the whole `date_trunc(interval)` of
    /// its time: `end_timestamp` is the last bucket's start.
    fn query(&self, customer: &CustomerId) -> [(&'static str, String); 5] {
        let time = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        [
            ("start_timestamp", time(self.first)),
            ("end_timestamp", time(self.last)),
            ("interval", self.interval.name().to_owned()),
            ("timezone", "UTC".to_owned()),
            ("customer_id", customer.as_str().to_owned()),
        ]
    }

    /// The `total` of Polar's `MeterQuantities`, once its buckets are those asked: any other
    /// series would be another window's total.
    fn total(&self, answer: &Value) -> anyhow::Result<f64> {
        let buckets = answer
            .get("quantities")
            .and_then(Value::as_array)
            .context("no `quantities`")?;
        let mut expected = self.first;
        for bucket in buckets {
            let at = bucket
                .get("timestamp")
                .and_then(Value::as_str)
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .context("a quantity without its `timestamp`")?;
            anyhow::ensure!(
                at == expected && expected <= self.last,
                "Polar answered a bucket at {at}, not the one asked at {expected}"
            );
            expected += self.interval.step();
        }
        anyhow::ensure!(
            expected == self.last + self.interval.step(),
            "Polar answered {} buckets, not those from {} to {}",
            buckets.len(),
            self.first,
            self.last
        );
        answer
            .get("total")
            .and_then(Value::as_f64)
            .context("no `total`")
    }
}

/// The reads that give exactly `[start, end)`: whole days by the day, the hours before and
/// after them by the hour (Polar takes at most 7 days by the hour, 366 by the day). `None`
/// when the window is not on whole UTC hours or too long: Polar cannot give it exactly.
fn reads(start: DateTime<Utc>, end: DateTime<Utc>) -> Option<Vec<Read>> {
    let (hour, day) = (TimeDelta::hours(1), TimeDelta::days(1));
    let on = |t: DateTime<Utc>, step: TimeDelta| t.duration_trunc(step).ok() == Some(t);
    if !on(start, hour) || !on(end, hour) {
        return None;
    }
    if end <= start {
        return Some(Vec::new());
    }
    let floor = |t: DateTime<Utc>| t.duration_trunc(day).ok();
    let first_day = if on(start, day) {
        start
    } else {
        floor(start)? + day
    };
    let last_day = floor(end)?;
    if first_day >= last_day {
        // No whole day: under two days by the hour.
        return Some(vec![Read::over(start, end, Interval::Hour)]);
    }
    if last_day - first_day > TimeDelta::days(366) {
        return None;
    }
    let mut reads = Vec::new();
    if start < first_day {
        reads.push(Read::over(start, first_day, Interval::Hour));
    }
    reads.push(Read::over(first_day, last_day, Interval::Day));
    if last_day < end {
        reads.push(Read::over(last_day, end, Interval::Hour));
    }
    Some(reads)
}

/// The ingest request of one report.
fn body(event_name: &str, report: &MeterReport) -> Value {
    json!({"events": [{
        "name": event_name,
        "customer_id": report.customer.as_str(),
        "external_id": report.identifier,
        "timestamp": report.occurred_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "metadata": {"value": report.signed_value()},
    }]})
}

/// A 422 that names only the timestamp as in Polar's future: Polar's clock is behind ours, and
/// the same report is taken a little later.
fn clock_behind(status: reqwest::StatusCode, body: &Value) -> Option<Sent> {
    let errors = body.get("detail").and_then(Value::as_array)?;
    let only_time = !errors.is_empty()
        && errors.iter().all(|e| {
            e.get("msg")
                .and_then(Value::as_str)
                .is_some_and(|m| m.contains("Timestamp must be in the past"))
        });
    (status.as_u16() == 422 && only_time)
        .then(|| Sent::NotTaken("Polar's clock is behind this report's timestamp".to_owned()))
}

impl Meter for PolarMeter {
    fn send<'a>(&'a self, report: &'a MeterReport) -> BoxFuture<'a, Sent> {
        Box::pin(self.post(report))
    }

    fn dedupe(&self) -> Dedupe {
        Dedupe::Always
    }

    fn total_step(&self) -> TimeDelta {
        TimeDelta::hours(1)
    }

    fn total<'a>(
        &'a self,
        customer: &'a CustomerId,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> BoxFuture<'a, anyhow::Result<Option<f64>>> {
        Box::pin(self.summed(customer, start, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::CustomerId;

    #[test]
    fn a_report_is_one_ingested_event_with_its_identifier_and_a_numeric_value() {
        let report = MeterReport {
            id: "mrp_1".into(),
            source: "polar".into(),
            customer: CustomerId::parse("992fae2a-2a17-4b7a-8d9e-e287cf90131b").unwrap(),
            identifier: "bi_abc".into(),
            meter: "api_calls".into(),
            value: 7,
            occurred_at: "2026-12-03T10:00:00.250Z".parse().unwrap(),
            first_sent_at: None,
            unanswered: false,
            take_back: None,
            send_key: None,
        };
        assert_eq!(
            body("api_calls", &report),
            json!({"events": [{"name": "api_calls",
                "customer_id": "992fae2a-2a17-4b7a-8d9e-e287cf90131b", "external_id": "bi_abc",
                "timestamp": "2026-12-03T10:00:00.250Z", "metadata": {"value": 7}}]})
        );
    }

    /// A meter as Polar's `Meter` schema writes it (`server/polar/meter/schemas.py`).
    fn meter(id: &str, clauses: Value, aggregation: Value, archived: bool) -> Value {
        json!({"id": id, "created_at": "2026-11-02T09:00:00Z", "modified_at": null,
            "metadata": {}, "name": format!("Meter {id}"), "unit": "scalar",
            "custom_label": null, "custom_multiplier": null,
            "filter": {"conjunction": "and", "clauses": clauses}, "aggregation": aggregation,
            "organization_id": "1dbfc517-0bbf-4301-9ba8-555ca42b9737",
            "archived_at": archived.then_some("2026-11-20T09:00:00Z")})
    }

    #[test]
    fn the_meter_is_the_one_summing_value_over_exactly_the_event_name() {
        let name_is = |n: &str| json!([{"property": "name", "operator": "eq", "value": n}]);
        let sum = json!({"func": "sum", "property": "value"});
        let count = json!({"func": "count"});
        let narrower = json!([{"property": "name", "operator": "eq", "value": "api_calls"},
            {"property": "region", "operator": "eq", "value": "eu"}]);
        let like = json!([{"property": "name", "operator": "like", "value": "api_calls"}]);
        let nested = json!([{"conjunction": "or", "clauses": name_is("api_calls")}]);
        let not_ours = [
            meter("m_other", name_is("seats"), sum.clone(), false),
            meter("m_count", name_is("api_calls"), count, false),
            meter("m_eu", narrower, sum.clone(), false),
            meter("m_like", like, sum.clone(), false),
            meter("m_nested", nested, sum.clone(), false),
            meter(
                "m_max",
                name_is("api_calls"),
                json!({"func": "max", "property": "value"}),
                false,
            ),
        ];
        assert_eq!(chosen(&not_ours, "api_calls"), None);
        let mut meters = not_ours.to_vec();
        meters.push(meter("m_old", name_is("api_calls"), sum.clone(), true));
        assert_eq!(
            chosen(&meters, "api_calls"),
            Some("m_old"),
            "archived counts alike"
        );
        meters.push(meter("m_api", name_is("api_calls"), sum, false));
        assert_eq!(
            chosen(&meters, "api_calls"),
            Some("m_api"),
            "an active one first"
        );
    }

    fn at(t: &str) -> DateTime<Utc> {
        t.parse().unwrap()
    }

    fn read(first: &str, last: &str, interval: Interval) -> Read {
        Read {
            first: at(first),
            last: at(last),
            interval,
        }
    }

    #[test]
    fn a_window_on_whole_hours_is_read_as_whole_days_then_whole_hours() {
        assert_eq!(
            reads(at("2026-12-01T00:00:00Z"), at("2026-12-11T10:00:00Z")),
            Some(vec![
                read(
                    "2026-12-01T00:00:00Z",
                    "2026-12-10T00:00:00Z",
                    Interval::Day
                ),
                read(
                    "2026-12-11T00:00:00Z",
                    "2026-12-11T09:00:00Z",
                    Interval::Hour
                ),
            ])
        );
        assert_eq!(
            reads(at("2026-11-01T00:00:00Z"), at("2026-12-01T00:00:00Z")),
            Some(vec![read(
                "2026-11-01T00:00:00Z",
                "2026-11-30T00:00:00Z",
                Interval::Day
            )]),
            "a whole month: its days"
        );
        assert_eq!(
            reads(at("2026-12-01T22:00:00Z"), at("2026-12-04T03:00:00Z")),
            Some(vec![
                read(
                    "2026-12-01T22:00:00Z",
                    "2026-12-01T23:00:00Z",
                    Interval::Hour
                ),
                read(
                    "2026-12-02T00:00:00Z",
                    "2026-12-03T00:00:00Z",
                    Interval::Day
                ),
                read(
                    "2026-12-04T00:00:00Z",
                    "2026-12-04T02:00:00Z",
                    Interval::Hour
                ),
            ])
        );
        assert_eq!(
            reads(at("2026-12-01T22:00:00Z"), at("2026-12-02T03:00:00Z")),
            Some(vec![read(
                "2026-12-01T22:00:00Z",
                "2026-12-02T02:00:00Z",
                Interval::Hour
            )]),
            "no whole day: by the hour"
        );
        assert_eq!(
            reads(at("2026-12-01T00:00:00Z"), at("2026-12-01T00:00:00Z")),
            Some(vec![])
        );
        assert_eq!(
            reads(at("2026-12-01T00:00:00Z"), at("2026-12-11T10:44:00Z")),
            None,
            "Polar has no bucket ending at a minute"
        );
        assert_eq!(
            reads(at("2024-01-01T00:00:00Z"), at("2026-01-01T00:00:00Z")),
            None
        );
    }

    #[test]
    fn a_total_is_taken_only_over_the_buckets_asked() {
        let asked = read(
            "2026-12-11T00:00:00Z",
            "2026-12-11T02:00:00Z",
            Interval::Hour,
        );
        let answer = |times: &[&str]| {
            json!({"quantities": times.iter()
                    .map(|t| json!({"timestamp": t, "quantity": 1.0})).collect::<Vec<_>>(),
                "total": times.len() as f64})
        };
        let whole = answer(&[
            "2026-12-11T00:00:00Z",
            "2026-12-11T01:00:00+00:00",
            "2026-12-11T02:00:00Z",
        ]);
        assert_eq!(asked.total(&whole).unwrap(), 3.0);
        let one_more = answer(&[
            "2026-12-11T00:00:00Z",
            "2026-12-11T01:00:00Z",
            "2026-12-11T02:00:00Z",
            "2026-12-11T03:00:00Z",
        ]);
        assert!(asked.total(&one_more).is_err());
        let short = answer(&["2026-12-11T00:00:00Z", "2026-12-11T01:00:00Z"]);
        assert!(asked.total(&short).is_err());
        let shifted = answer(&[
            "2026-12-11T01:00:00Z",
            "2026-12-11T02:00:00Z",
            "2026-12-11T03:00:00Z",
        ]);
        assert!(asked.total(&shifted).is_err());
    }

    #[test]
    fn a_timestamp_in_polars_future_is_sent_again_later() {
        let ahead = json!({"detail": [{"type": "value_error", "loc": ["body", "events", 0, "timestamp"],
            "msg": "Value error, Timestamp must be in the past.", "input": "2026-12-03T10:00:00Z"}]});
        let unprocessable = reqwest::StatusCode::UNPROCESSABLE_ENTITY;
        assert!(matches!(
            clock_behind(unprocessable, &ahead),
            Some(Sent::NotTaken(_))
        ));
        let customer = json!({"detail": [{"loc": ["body", "events", 0, "customer_id"], "msg": "Customer not found."}]});
        assert_eq!(clock_behind(unprocessable, &customer), None);
    }
}
