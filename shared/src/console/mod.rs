//! The operator console's pages (served by the `api` function, docs/design.md §12.7):
//! the static shell, its two embedded assets, and each page's HTML fragment rendered from the
//! admin API's JSON. Pure rendering: no database, no HTTP. Every value is escaped by `maud`;
//! no page holds an inline script or style, so the strict [`CSP`] holds.
//!
//! - `page`: the pages and their paths ([`Page::parse`]);
//! - `shell`: the page every console address answers with, before any data;
//! - `overview`, `events`, `event`, `account`, `effects`, `meters`, `divergences`, `engine_room`,
//!   `audit_trail`: one
//!   fragment each, from the JSON its route answers;
//! - `chart`: the overview's pictures of the last 24 hours (events, deliveries) and of what
//!   waits, SVG with a table beside each;
//! - `timeline`: an account's pictures: its allowance over the period, its plan's changes;
//! - `view`: what they share (links, times, statuses).

mod account;
mod audit_trail;
mod chart;
mod divergences;
mod effects;
mod engine_room;
mod event;
mod events;
mod meters;
mod overview;
mod page;
mod shell;
mod timeline;
mod view;

use maud::html;
use serde_json::Value;

pub use page::Page;
pub use shell::shell;

/// The Content-Security-Policy of every console answer: only this origin's script, style and
/// requests, no inline code, no framing.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; \
    frame-ancestors 'none'";

/// The `Content-Type` of the shell and of every fragment.
pub const HTML: &str = "text/html; charset=utf-8";

/// The `Cache-Control` of an asset, in place of [`security_headers`]' `no-store`: its content
/// changes only with a deploy.
pub const ASSET_CACHE_CONTROL: &str = "public, max-age=86400";

/// The headers of every console answer (lowercase names). An asset's answer takes
/// [`ASSET_CACHE_CONTROL`] instead of `no-store`.
pub fn security_headers() -> [(&'static str, &'static str); 4] {
    [
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
    ]
}

const CONSOLE_JS: &str = include_str!("assets/console.js");
const CONSOLE_CSS: &str = include_str!("assets/console.css");

/// An embedded asset by its name under `{base}/console/assets/`: its `Content-Type` and
/// content; `None` for any other name.
pub fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "console.js" => Some(("text/javascript; charset=utf-8", CONSOLE_JS)),
        "console.css" => Some(("text/css; charset=utf-8", CONSOLE_CSS)),
        _ => None,
    }
}

/// A page's fragment from the JSON of its route(s):
///
/// - `Overview`: `GET /v1/admin/overview`, with `"traffic"`: the last 24 hours' events by hour
///   and status (`[{hour, status, count}]`), and `"deliveries"`: their deliveries by hour and
///   outcome (`[{hour, outcome, count}]`, `operate::overview::deliveries_by_hour`);
/// - `Events`: `GET /v1/admin/events` (`query` is the page's: the search form's values and
///   `after`);
/// - `Event`: `GET /v1/admin/events/{id}`;
/// - `Account`: `{"account": GET /v1/accounts/{s}/{c}, "events": GET …/events, "why": GET
///   …/why, "at": the cut or null, "allowance_history": operate::history's of the period,
///   "plan_timeline": audit::plan_timeline's steps, or null when the fold cannot say}`;
/// - `Effects`: `GET /v1/admin/effects`;
/// - `Meters`: `GET /v1/admin/meter-reports`, with `"meters"`: each metered source's meter;
/// - `Divergences`: `GET /v1/admin/divergences`;
/// - `EngineRoom`: `GET /v1/admin/engine-room`, or `{"enabled": false}`;
/// - `AuditTrail`: `GET /v1/admin/audit-trail`.
///
/// `base` is what precedes `/console` in the request's path; every link starts with it.
pub fn render(page: &Page, data: &Value, query: &[(String, String)], base: &str) -> String {
    let links = view::Links { base };
    match page {
        Page::Overview => overview::render(data, links),
        Page::Events => events::render(data, query, links),
        Page::Event(id) => event::render(*id, data, links),
        Page::Account { source, customer } => account::render((source, customer), data, links),
        Page::Effects => effects::render(data, query, links),
        Page::Meters => meters::render(data, query, links),
        Page::Divergences => divergences::render(data, links),
        Page::EngineRoom => engine_room::render(data, links),
        Page::AuditTrail => audit_trail::render(data, query, links),
    }
    .into_string()
}

/// The fragment of an answer that is not a page: `<div id="error" role="alert">`.
pub fn error_fragment(code: &str, detail: &str) -> String {
    html! {
        div #error role="alert" { strong { (code) } " " (detail) }
    }
    .into_string()
}

#[cfg(test)]
mod tests;
