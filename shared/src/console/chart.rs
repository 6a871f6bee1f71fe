//! The overview's picture: events received in the last 24 hours, an hour a bar, each bar cut
//! by the events' status now. Drawn here as SVG (no script, styled by the console's own
//! stylesheet, so the CSP stays `'self'`), every number in words beside the colour (a bar's
//! title, the dead and unprocessable ones marked with their count above the bar), and the
//! same numbers in a table for a screen reader or a reader who would rather read.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, DurationRound, Utc};
use maud::{html, Markup};
use serde_json::Value;

use super::view::{list, text, Links};

/// The statuses in a bar's order, bottom up: the finished ones first, then those that wait,
/// then those that need a person.
const STATUSES: [&str; 7] = [
    "applied",
    "ignored",
    "received",
    "processing",
    "failed",
    "unprocessable",
    "dead",
];

/// The statuses a person must see even on a small bar.
const STANDS_OUT: [&str; 2] = ["dead", "unprocessable"];

const HOURS: usize = 24;
const WIDTH: i64 = 720;
const HEIGHT: i64 = 180;
/// Room above the bars for the marks, below them for the hours.
const TOP: i64 = 18;
const BOTTOM: i64 = 20;

/// Events by hour and status: 24 hours ending with `now`'s, the oldest first.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Hourly {
    pub hours: Vec<DateTime<Utc>>,
    /// Per status (of [`STATUSES`], those with any event), a count per hour.
    pub counts: BTreeMap<&'static str, Vec<i64>>,
}

impl Hourly {
    /// From the overview's `traffic` (`[{hour, status, count}]`) as of `now`; an hour or a
    /// status outside the chart is left out.
    pub fn of(traffic: &[Value], now: DateTime<Utc>) -> Self {
        let last = now.duration_trunc(Duration::hours(1)).unwrap_or(now);
        let hours: Vec<DateTime<Utc>> = (0..HOURS as i64)
            .rev()
            .map(|back| last - Duration::hours(back))
            .collect();
        let mut counts: BTreeMap<&'static str, Vec<i64>> = BTreeMap::new();
        for row in traffic {
            let Some(status) = STATUSES.iter().find(|s| **s == text(row, "status")) else {
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
        Self { hours, counts }
    }

    /// Each status's total over the 24 hours.
    pub fn totals(&self) -> Vec<(&'static str, i64)> {
        STATUSES
            .iter()
            .filter_map(|s| Some((*s, self.counts.get(s)?.iter().sum())))
            .collect()
    }

    fn at(&self, status: &str, hour: usize) -> i64 {
        self.counts.get(status).map_or(0, |c| c[hour])
    }

    fn hour_total(&self, hour: usize) -> i64 {
        STATUSES.iter().map(|s| self.at(s, hour)).sum()
    }
}

/// An hour's bar in words: `10:00 UTC: 3 applied, 1 dead`.
fn said(h: &Hourly, hour: usize) -> String {
    let parts: Vec<String> = STATUSES
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
    for status in STATUSES {
        let n = h.at(status, hour);
        if n > 0 {
            let tall = (n * plot / peak).max(2);
            base -= tall;
            pieces.push((status, n, base, tall));
        }
    }
    pieces
}

pub(super) fn render(data: &Value, links: Links) -> Markup {
    let now = DateTime::parse_from_rfc3339(text(data, "generated_at"))
        .map(|t| t.with_timezone(&Utc))
        .unwrap_or_else(|_| Utc::now());
    let h = Hourly::of(list(data, "traffic"), now);
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
        section aria-labelledby="traffic-title" {
            h2 #traffic-title { "Events received, last 24 hours" }
            p.meta #traffic-desc {
                "An hour a bar, each cut by what became of its events (their status now); a dead "
                "or unprocessable one is marked with its count above its bar. The same numbers "
                "are in the table below the picture."
            }
            figure #traffic-chart data-total=(totals.iter().map(|(_, n)| n).sum::<i64>())
                data-dead=(h.counts.get("dead").map_or(0, |c| c.iter().sum::<i64>())) {
                svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } role="img"
                    aria-labelledby="traffic-title traffic-desc" class="chart" {
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
                            @let marked: i64 = STANDS_OUT.iter().map(|s| h.at(s, hour)).sum();
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
                                a href=(links.console_query("events", &[("status", status)])) { (status) }
                                " " span data-total=(status) { (n) }
                            }
                        }
                        @if totals.is_empty() { li.quiet { "No event received in the last 24 hours." } }
                    }
                }
            }
            details #traffic-numbers {
                summary { "The numbers, hour by hour" }
                div.scroll {
                    table #traffic-table {
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
