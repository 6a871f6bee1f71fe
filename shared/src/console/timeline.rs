//! An account's pictures: its allowance over the period (granted and used, day by day) and its
//! plan's timeline (each change a point linking to the event that made it). SVG written on the
//! server as the overview's are (`chart`), each line said in words (its label at its end, a
//! point's title) and not by colour alone (the granted line solid, the used one dashed), each
//! with a table that holds the same numbers.

use chrono::{DateTime, Datelike, Duration, NaiveDate, Utc};
use maud::{html, Markup};
use serde_json::Value;

use super::view::{int, list, text, time, time_str, Links};

const WIDTH: i64 = 720;
const HEIGHT: i64 = 170;
const LEFT: i64 = 8;
/// Room at the right for the lines' labels, below for the days.
const RIGHT: i64 = 110;
const TOP: i64 = 14;
const BOTTOM: i64 = 20;

/// A period's allowance in time: each day the balance or the use moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Day {
    pub day: NaiveDate,
    /// The balance granted by the end of the day.
    pub granted: i64,
    pub debited: i64,
    pub reversed: i64,
    /// Used by the end of the day: the debits accepted so far less those reversed.
    pub used: i64,
}

/// The days of `history` (`operate::history::AllowanceHistory` as JSON) on which a grant or a
/// debit moved something, in order, each with what was granted and used by its end. A time
/// outside the period (a debit may name another period than its day's) counts on the period's
/// nearest day.
pub(super) fn days(history: &Value) -> Vec<Day> {
    let Some((first, last)) = bounds(text(history, "period")) else {
        return Vec::new();
    };
    let day_of = |value: &Value| {
        DateTime::parse_from_rfc3339(value.as_str().unwrap_or_default())
            .ok()
            .map(|t| t.with_timezone(&Utc).date_naive().clamp(first, last))
    };
    let mut moves: std::collections::BTreeMap<NaiveDate, (i64, i64, i64)> = Default::default();
    for grant in list(history, "grants") {
        if let Some(day) = day_of(&grant["at"]) {
            moves.entry(day).or_default().0 += int(grant, "delta").unwrap_or(0);
        }
    }
    for used in list(history, "days") {
        if let Some(day) = day_of(&used["day"]) {
            let entry = moves.entry(day).or_default();
            entry.1 += int(used, "debited").unwrap_or(0);
            entry.2 += int(used, "reversed").unwrap_or(0);
        }
    }
    let (mut granted, mut used) = (0, 0);
    moves
        .into_iter()
        .map(|(day, (delta, debited, reversed))| {
            granted += delta;
            used += debited - reversed;
            Day {
                day,
                granted,
                debited,
                reversed,
                used,
            }
        })
        .collect()
}

/// A period's first and last day.
fn bounds(period: &str) -> Option<(NaiveDate, NaiveDate)> {
    let first = NaiveDate::parse_from_str(&format!("{period}-01"), "%Y-%m-%d").ok()?;
    let next = first.checked_add_months(chrono::Months::new(1))?;
    Some((first, next.pred_opt()?))
}

/// The period's allowance, granted and used, over its days.
pub(super) fn allowance(history: &Value, links: Links) -> Markup {
    let Some((first, last)) = bounds(text(history, "period")) else {
        return html! {};
    };
    let days = days(history);
    let grants = list(history, "grants");
    // The lines end today in the current period, at the month's end in a past one.
    let end = DateTime::parse_from_rfc3339(text(history, "as_of"))
        .map(|t| t.with_timezone(&Utc).date_naive().clamp(first, last))
        .unwrap_or(last)
        .max(days.last().map_or(first, |d| d.day));
    let span = i64::from(last.day());
    let granted = days.last().map_or(0, |d| d.granted);
    let used = days.last().map_or(0, |d| d.used);
    let peak = days
        .iter()
        .map(|d| d.granted.max(d.used))
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    // A day's end on the x axis; an amount on the y axis.
    let x = |day: NaiveDate| LEFT + i64::from(day.day()) * plot_w / span;
    let y = |n: i64| HEIGHT - BOTTOM - n * plot_h / peak;
    let steps = |value: fn(&Day) -> i64| {
        let mut points = vec![(LEFT, y(0))];
        let mut now = 0;
        for d in &days {
            let start = x(d.day) - plot_w / span;
            points.push((start, y(now)));
            now = value(d);
            points.push((start, y(now)));
        }
        points.push((x(end), y(now)));
        points
            .iter()
            .map(|(x, y)| format!("{x},{y}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        section aria-labelledby="allowance-title" {
            h3 #allowance-title { "Allowance over " (text(history, "period")) }
            p.meta #allowance-desc {
                "Granted (the solid line, a point at each grant, linked to its event) and used "
                "(the dashed line, the debits accepted less those reversed), by the end of each "
                "day of the period. The same numbers are in the table below the picture."
            }
            figure #allowance-chart data-granted=(granted) data-used=(used) {
                svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img" class="chart"
                    aria-labelledby="allowance-title allowance-desc" {
                    line.axis x1=(LEFT) y1=(y(0)) x2=(WIDTH - RIGHT) y2=(y(0)) {}
                    @if end < last {
                        text.tick x=(x(end) - 4) y=(y(0) - 4) text-anchor="end" { "today" }
                        line.today x1=(x(end)) y1=(TOP) x2=(x(end)) y2=(y(0)) {}
                    }
                    @for day in [1, 8, 15, 22, 29].into_iter().filter(|d| *d <= last.day()) {
                        @if let Some(at) = first.with_day(day) {
                            text.tick x=(x(at) - plot_w / span / 2) y=(HEIGHT - 5) text-anchor="middle" {
                                (at.format("%d %b"))
                            }
                        }
                    }
                    polyline.granted points=(steps(|d| d.granted)) {}
                    polyline.used points=(steps(|d| d.used)) {}
                    text.line-label x=(x(end) + 6) y=(y(granted) + 4) { "granted " (granted) }
                    text.line-label x=(x(end) + 6) y=(y(used) + 4 + if used == granted { 14 } else { 0 }) {
                        "used " (used)
                    }
                    @for grant in grants {
                        @let event = int(grant, "event_id").unwrap_or(0);
                        @let day = DateTime::parse_from_rfc3339(text(grant, "at"))
                            .map(|t| t.with_timezone(&Utc).date_naive().clamp(first, last))
                            .unwrap_or(first);
                        @let by_then = days.iter().find(|d| d.day == day).map_or(0, |d| d.granted);
                        a href=(links.event(event)) {
                            circle.grant cx=(x(day) - plot_w / span) cy=(y(by_then)) r="4"
                                data-event-id=(event) {
                                title {
                                    (text(grant, "plan")) " grants " (int(grant, "allowance").unwrap_or(0))
                                    ", +" (int(grant, "delta").unwrap_or(0)) ", event #" (event)
                                }
                            }
                        }
                    }
                }
            }
            @if days.is_empty() { p.empty { "Nothing granted or used in " (text(history, "period")) "." } }
            details #allowance-numbers {
                summary { "The numbers, day by day" }
                div.scroll {
                    table #allowance-table {
                        thead {
                            tr {
                                th scope="col" { "Day (UTC)" }
                                th scope="col" { "Granted" span.second { "by then" } }
                                th scope="col" { "Debited" }
                                th scope="col" { "Given back" span.second { "reversals" } }
                                th scope="col" { "Used" span.second { "by then" } }
                            }
                        }
                        tbody {
                            @for d in &days {
                                tr data-day=(d.day) {
                                    th scope="row" { (d.day) }
                                    td.num data-granted { (d.granted) }
                                    td.num { (d.debited) }
                                    td.num { (d.reversed) }
                                    td.num data-used { (d.used) }
                                }
                            }
                        }
                    }
                }
                @if !grants.is_empty() {
                    ul #allowance-grants {
                        @for grant in grants {
                            @let event = int(grant, "event_id").unwrap_or(0);
                            li {
                                (time(&grant["at"])) ": " (text(grant, "plan")) " grants "
                                (int(grant, "allowance").unwrap_or(0)) " (+" (int(grant, "delta").unwrap_or(0)) "), "
                                a href=(links.event(event)) { "event #" (event) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The plan's timeline: each change (`audit::PlanStep` as JSON) a point at its event's
/// provider time, linked to the event, the plan it went to above it.
pub(super) fn plan(steps: &Value, links: Links) -> Markup {
    let Some(steps) = steps.as_array() else {
        return html! {
            section aria-labelledby="plan-timeline-title" {
                h3 #plan-timeline-title { "Plan over time" }
                p.note #plan-timeline-none { "The plan's timeline cannot be said: the account's events are not folded (see Why)." }
            }
        };
    };
    let at = |step: &Value| {
        DateTime::parse_from_rfc3339(text(&step["event"], "occurred_at"))
            .ok()
            .map(|t| t.with_timezone(&Utc))
    };
    let times: Vec<DateTime<Utc>> = steps.iter().filter_map(at).collect();
    let (start, end) = match (times.iter().min(), times.iter().max()) {
        (Some(a), Some(b)) => (*a, (*b).max(*a + Duration::seconds(1))),
        _ => (Utc::now(), Utc::now()),
    };
    let height = 90;
    let axis = 60;
    let plot_w = WIDTH - 2 * 60;
    let x = |t: DateTime<Utc>| match times.len() {
        1 => WIDTH / 2,
        _ => 60 + ((t - start).num_seconds() * plot_w) / (end - start).num_seconds().max(1),
    };
    html! {
        section aria-labelledby="plan-timeline-title" {
            h3 #plan-timeline-title { "Plan over time" }
            p.meta #plan-timeline-desc {
                "Each change of the plan, as its events give it, a point at its event's provider "
                "time (linked to the event), the plan it went to above it. The same changes are "
                "listed below the picture."
            }
            @if !steps.is_empty() {
                figure #plan-timeline data-changes=(steps.len()) {
                    svg viewBox={ "0 0 " (WIDTH) " " (height) } role="img" class="chart"
                        aria-labelledby="plan-timeline-title plan-timeline-desc" {
                        line.axis x1="40" y1=(axis) x2=(WIDTH - 40) y2=(axis) {}
                        @for (i, step) in steps.iter().enumerate() {
                            @let event = int(&step["event"], "event_id").unwrap_or(0);
                            @let px = at(step).map_or(WIDTH / 2, x);
                            // Neighbours' labels take turns at two heights.
                            @let label_y = if i % 2 == 0 { axis - 14 } else { axis - 32 };
                            a href=(links.event(event)) {
                                g.plan-step data-event-id=(event) {
                                    title {
                                        (text(step, "from")) " → " (text(step, "to")) ", event #" (event)
                                        " " (text(&step["event"], "type"))
                                    }
                                    circle.step cx=(px) cy=(axis) r="5" {}
                                    text.step-label x=(px) y=(label_y) text-anchor="middle" { (text(step, "to")) }
                                }
                            }
                        }
                        @if let Some(first) = times.first() {
                            text.tick x="40" y=(height - 6) { (first.format("%Y-%m-%d")) }
                        }
                        @if times.len() > 1 {
                            @if let Some(last) = times.last() {
                                text.tick x=(WIDTH - 40) y=(height - 6) text-anchor="end" { (last.format("%Y-%m-%d")) }
                            }
                        }
                    }
                }
            }
            ol #plan-changes {
                @for step in steps {
                    @let event = int(&step["event"], "event_id").unwrap_or(0);
                    li data-event-id=(event) {
                        (time_str(text(&step["event"], "occurred_at"))) ": "
                        (text(step, "from")) " → " strong { (text(step, "to")) } ", by "
                        a href=(links.event(event)) { "event #" (event) }
                        " " code { (text(&step["event"], "type")) }
                    }
                }
            }
            @if steps.is_empty() { p.empty #plan-timeline-none { "No event changed the plan." } }
        }
    }
}
