//! The overview's pictures of the last 24 hours, an hour a bar: the events received, each bar
//! cut by the events' status now, and the deliveries, cut by their outcome. Drawn here as SVG
//! (no script, styled by the console's own stylesheet, so the CSP stays `'self'`), every
//! number in words beside the colour (a bar's title, what needs a person marked with its count
//! above the bar), and the same numbers in a table for a screen reader or a reader who would
//! rather read.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, DurationRound, Utc};
use maud::{html, Markup};
use serde_json::Value;

use super::view::{list, text, Links};

/// What a picture counts hour by hour: its rows' key (`traffic` or `deliveries`, also its
/// elements' id prefix), the field naming a row's kind, the kinds in a bar's order bottom up,
/// those a person must see even on a small bar, and its words.
pub(super) struct Counted {
    pub key: &'static str,
    pub field: &'static str,
    pub kinds: &'static [&'static str],
    pub stand_out: &'static [&'static str],
    title: &'static str,
    desc: &'static str,
    none: &'static str,
    /// Whether each kind has an events list to link (an event's status does).
    linked: bool,
}

/// The events received, by their status now: the finished ones first, then those that wait,
/// then those that need a person.
pub(super) const EVENTS: Counted = Counted {
    key: "traffic",
    field: "status",
    kinds: &[
        "applied",
        "ignored",
        "received",
        "processing",
        "failed",
        "unprocessable",
        "dead",
    ],
    stand_out: &["dead", "unprocessable"],
    title: "Events received, last 24 hours",
    desc: "An hour a bar, each cut by what became of its events (their status now); a dead or \
        unprocessable one is marked with its count above its bar. The same numbers are in the \
        table below the picture.",
    none: "No event received in the last 24 hours.",
    linked: true,
};

/// Every delivery attempt, by what the intake made of it: a new event stored, a copy of a
/// stored one, a conflict (same id, other content), or refused 401 (a bad signature).
pub(super) const DELIVERIES: Counted = Counted {
    key: "deliveries",
    field: "outcome",
    kinds: &["stored", "duplicate", "conflict", "refused"],
    stand_out: &["conflict", "refused"],
    title: "Deliveries, last 24 hours",
    desc: "An hour a bar, each cut by what the intake made of each delivery: stored (a new \
        event), duplicate (a copy of a stored one), conflict (the same id with other content) \
        or refused (401: its signature did not verify). A conflict or a refusal is marked with \
        its count above its bar. The same numbers are in the table below the picture.",
    none: "No delivery in the last 24 hours.",
    linked: false,
};

const HOURS: usize = 24;
const WIDTH: i64 = 720;
const HEIGHT: i64 = 180;
/// Room above the bars for the marks, below them for the hours.
const TOP: i64 = 18;
const BOTTOM: i64 = 20;

/// Counts by hour and kind: 24 hours ending with `now`'s, the oldest first.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hourly {
    pub kinds: &'static [&'static str],
    pub hours: Vec<DateTime<Utc>>,
    /// Per kind (of `kinds`, those with any count), a count per hour.
    pub counts: BTreeMap<&'static str, Vec<i64>>,
}

impl Hourly {
    /// From rows `[{hour, <field>, count}]` as of `now`; an hour or a kind outside the chart
    /// is left out.
    pub fn of(counted: &Counted, rows: &[Value], now: DateTime<Utc>) -> Self {
        let last = now.duration_trunc(Duration::hours(1)).unwrap_or(now);
        let hours: Vec<DateTime<Utc>> = (0..HOURS as i64)
            .rev()
            .map(|back| last - Duration::hours(back))
            .collect();
        let mut counts: BTreeMap<&'static str, Vec<i64>> = BTreeMap::new();
        for row in rows {
            let Some(status) = counted
                .kinds
                .iter()
                .find(|s| **s == text(row, counted.field))
            else {
                continue;
            };
            let Some(at) = DateTime::parse_from_rfc3339(text(row, "hour"))
                .ok()
                .map(|t| t.with_timezone(&Utc))
            else {
                continue;
            };
            if let Some(slot) = hours.iter().position(|h| *h == at) {
                counts.entry(status).or_insert_with(|| vec![0; HOURS])[slot] +=
                    row["count"].as_i64().unwrap_or(0);
            }
        }
        Self {
            kinds: counted.kinds,
            hours,
            counts,
        }
    }

    /// Each kind's total over the 24 hours.
    pub fn totals(&self) -> Vec<(&'static str, i64)> {
        self.kinds
            .iter()
            .filter_map(|s| Some((*s, self.counts.get(s)?.iter().sum())))
            .collect()
    }

    fn at(&self, status: &str, hour: usize) -> i64 {
        self.counts.get(status).map_or(0, |c| c[hour])
    }

    fn hour_total(&self, hour: usize) -> i64 {
        self.kinds.iter().map(|s| self.at(s, hour)).sum()
    }

    fn total(&self, kind: &str) -> Option<i64> {
        self.counts.get(kind).map(|c| c.iter().sum())
    }
}

/// An hour's bar in words: `10:00 UTC: 3 applied, 1 dead`.
fn said(h: &Hourly, hour: usize) -> String {
    let parts: Vec<String> = h
        .kinds
        .iter()
        .filter(|s| h.at(s, hour) > 0)
        .map(|s| format!("{} {s}", h.at(s, hour)))
        .collect();
    let at = h.hours[hour].format("%H:00 UTC");
    match parts.is_empty() {
        true => format!("{at}: none"),
        false => format!("{at}: {}", parts.join(", ")),
    }
}

/// An hour's bar, bottom up: each status with events, its count, its top and its height (at
/// least 2, so that one event shows), `peak` events filling `plot`.
fn stack(h: &Hourly, hour: usize, plot: i64, peak: i64) -> Vec<(&'static str, i64, i64, i64)> {
    let mut base = HEIGHT - BOTTOM;
    let mut pieces = Vec::new();
    for status in h.kinds.iter().copied() {
        let n = h.at(status, hour);
        if n > 0 {
            let tall = (n * plot / peak).max(2);
            base -= tall;
            pieces.push((status, n, base, tall));
        }
    }
    pieces
}

/// The picture of what `counted` counts in the overview's `data`, with its table.
pub(super) fn render(counted: &Counted, data: &Value, links: Links) -> Markup {
    let now = DateTime::parse_from_rfc3339(text(data, "generated_at"))
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|_| Utc::now());
    let h = Hourly::of(counted, list(data, counted.key), now);
    let id = |what: &str| format!("{}-{what}", counted.key);
    let peak = (0..HOURS)
        .map(|i| h.hour_total(i))
        .max()
        .unwrap_or(0)
        .max(1);
    let slot = WIDTH / HOURS as i64;
    let bar = slot - 6;
    let plot = HEIGHT - TOP - BOTTOM;
    let totals = h.totals();
    html! {
        section aria-labelledby=(id("title")) {
            h2 id=(id("title")) { (counted.title) }
            p.meta id=(id("desc")) { (counted.desc) }
            figure id=(id("chart")) data-total=(totals.iter().map(|(_, n)| n).sum::<i64>())
                data-marked=(counted.stand_out.iter().filter_map(|k| h.total(k)).sum::<i64>())
                data-dead=[counted.kinds.contains(&"dead").then(|| h.total("dead").unwrap_or(0))]
                data-refused=[counted.kinds.contains(&"refused").then(|| h.total("refused").unwrap_or(0))] {
                svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img"
                    aria-labelledby={ (id("title")) " " (id("desc")) } class="chart" {
                    line.axis x1="0" y1=(HEIGHT - BOTTOM) x2=(WIDTH) y2=(HEIGHT - BOTTOM) {}
                    @for hour in 0..HOURS {
                        @let x = hour as i64 * slot + 3;
                        g.hour data-hour=(h.hours[hour].format("%H")) {
                            title { (said(&h, hour)) }
                            @let pieces = stack(&h, hour, plot, peak);
                            @for (status, n, y, tall) in &pieces {
                                rect class={ "bar s-" (status) } x=(x) y=(y) width=(bar) height=(tall)
                                    data-status=(status) data-count=(n) {}
                            }
                            @let top = pieces.last().map_or(HEIGHT - BOTTOM, |p| p.2);
                            @let marked: i64 = counted.stand_out.iter().map(|s| h.at(s, hour)).sum();
                            @if marked > 0 {
                                text.mark x=(x + bar / 2) y=(top - 4) text-anchor="middle" { "✕" (marked) }
                            }
                            @if hour % 3 == 0 {
                                text.tick x=(x + bar / 2) y=(HEIGHT - 5) text-anchor="middle" {
                                    (h.hours[hour].format("%H:00"))
                                }
                            }
                        }
                    }
                }
                figcaption {
                    ul.legend {
                        @for (status, n) in &totals {
                            li {
                                span class={ "swatch s-" (status) } aria-hidden="true" {}
                                @if counted.linked {
                                    a href=(links.console_query("events", &[("status", status)])) { (status) }
                                } @else { (status) }
                                " " span data-total=(status) { (n) }
                            }
                        }
                        @if totals.is_empty() { li.quiet { (counted.none) } }
                    }
                }
            }
            details id=(id("numbers")) {
                summary { "The numbers, hour by hour" }
                div.scroll {
                    table id=(id("table")) {
                        thead {
                            tr {
                                th scope="col" { "Hour (UTC)" }
                                @for (status, _) in &totals { th scope="col" { (status) } }
                            }
                        }
                        tbody {
                            @for hour in 0..HOURS {
                                @if h.hour_total(hour) > 0 {
                                    tr {
                                        th scope="row" { (h.hours[hour].format("%Y-%m-%d %H:00")) }
                                        @for (status, _) in &totals {
                                            td.num data-status=(status) { (h.at(status, hour)) }
                                        }
                                    }
                                }
                            }
                        }
                        tfoot {
                            tr {
                                th scope="row" { "24 hours" }
                                @for (status, n) in &totals { td.num data-total=(status) { (n) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The overview's effects and meter reports waiting, a bar each, beside the "Waiting" table
/// that holds the same numbers: (`data-count` name, a short label, the count, its list).
pub(super) fn waiting(bars: &[(&str, &str, i64, String)]) -> Markup {
    const LABEL: i64 = 190;
    const ROW: i64 = 24;
    const ROOM: i64 = WIDTH - LABEL - 60;
    let height = ROW * bars.len() as i64 + 4;
    let peak = bars.iter().map(|b| b.2).max().unwrap_or(0).max(1);
    html! {
        figure #waiting-chart {
            svg viewBox={ "0 0 " (WIDTH) " " (height) } role="img" class="chart"
                aria-labelledby="totals-title waiting-desc" {
                @for (i, (name, label, n, link)) in bars.iter().enumerate() {
                    @let y = i as i64 * ROW + 2;
                    @let long = if *n > 0 { (n * ROOM / peak).max(2) } else { 0 };
                    a href=(link) {
                        g.waiting data-figure=(name) {
                            title { (label) ": " (n) }
                            text.label x=(LABEL - 8) y=(y + 15) text-anchor="end" { (label) }
                            rect class={ "bar w-" (name) } x=(LABEL) y=(y + 3) width=(long) height=(ROW - 8)
                                data-count=(n) {}
                            text.value x=(LABEL + long + 6) y=(y + 15) { (n) }
                        }
                    }
                }
            }
            figcaption.meta #waiting-desc {
                "A bar each, its number at its end; the table below says what each counts and "
                "links its list."
            }
        }
    }
}
