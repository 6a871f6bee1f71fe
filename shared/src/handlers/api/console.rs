//! The console's HTTP side (docs/design.md §12.6): under `{base}/console/` the static shell
//! (no key needed: it holds no data), its two embedded assets, and each page's HTML fragment,
//! which needs an `admin` key and reads what the admin API and the app's routes answer. The
//! pages themselves are `crate::console`'s. Every answer carries the strict CSP.

use chrono::{DateTime, Utc};
use http::{Method, StatusCode};
use lambda_http::{Body, Request, Response};
use serde::Serialize;
use serde_json::json;
use sqlx::PgConnection;

use super::accounts::{account_value, credits_value, events_value, target, why_value};
use super::admin::{self, Route as AdminRoute};
use super::answer::{
    authenticate, on_held, require, settle, time_param, ApiError, Query, DEFAULT_LIMIT,
};
use super::state::ApiState;
use crate::audit::{self, Cut, FoldError};
use crate::console::{self, Page};
use crate::domain::Period;
use crate::handlers::engine_room::EngineError;
use crate::operate::{history, overview};
use crate::platform::api_keys::Scope;
use crate::platform::db::exec;

/// Answers a request whose path's segment `at` is `console`: the base is what precedes it.
pub(super) async fn serve(
    state: &ApiState,
    request: &Request,
    segments: &[&str],
    at: usize,
) -> Response<Body> {
    // The prefix the server in front cut from the path, then what the path shows before
    // `/console` (`/lambda-url/api` under `cargo lambda watch`; nothing deployed).
    let base = format!("{}{}", state.console_base, segments[..at].join("/"));
    let rest = &segments[at + 1..];
    if request.method() != Method::GET {
        return html(
            StatusCode::METHOD_NOT_ALLOWED,
            console::error_fragment(
                "method_not_allowed",
                "the console's pages are read with GET",
            ),
        );
    }
    match rest {
        ["assets", name] => match console::asset(name) {
            Some((content_type, content)) => {
                let mut response = answer(StatusCode::OK, content_type, content.to_owned());
                response.headers_mut().insert(
                    http::header::CACHE_CONTROL,
                    http::HeaderValue::from_static(console::ASSET_CACHE_CONTROL),
                );
                response
            }
            None => html(
                StatusCode::NOT_FOUND,
                console::error_fragment("not_found", "no such asset"),
            ),
        },
        ["fragment", page @ ..] => match fragment(state, request, &page.join("/"), &base).await {
            Ok(body) => html(StatusCode::OK, body),
            // As the API's routes answer an error (its log line, a 5xx's count for the alarm
            // and `Retry-After`), with the words of its code and detail, never its cause.
            Err(e) => {
                let headers = e.report();
                let mut response = html(
                    e.status(),
                    console::error_fragment(e.code(), &e.to_string()),
                );
                response.headers_mut().extend(headers);
                response
            }
        },
        _ => html(StatusCode::OK, console::shell(&base)),
    }
}

/// A page's fragment, for an `admin` key.
async fn fragment(
    state: &ApiState,
    request: &Request,
    path: &str,
    base: &str,
) -> Result<String, ApiError> {
    let caller = authenticate(&state.keys, request.headers())?;
    require(caller, Scope::Admin)?;
    let page = Page::parse(path).ok_or_else(|| ApiError::Missing("no such console page".into()))?;
    let query = Query::of(request);
    query.check(page.params())?;
    let admin = |route: AdminRoute, query: Query| async move {
        admin::answer(state, &caller.name, &route, &query, &[]).await
    };
    let with_limit = |query: &Query| {
        let mut pairs = query.0.clone();
        pairs.push(("limit".into(), DEFAULT_LIMIT.to_string()));
        Query(pairs)
    };
    let data = match &page {
        Page::Overview => {
            let mut overview = admin(AdminRoute::Overview, Query(Vec::new())).await?;
            let names: Vec<String> = state.sources.iter().map(|(name, _)| name.clone()).collect();
            overview["traffic"] = json!(on_held!(state, conn => traffic(conn, &names))?);
            overview["deliveries"] =
                json!(on_held!(state, conn => overview::deliveries_by_hour(conn))?);
            overview
        }
        Page::Events => admin(AdminRoute::Events, with_limit(&query)).await?,
        Page::Event(id) => admin(AdminRoute::Event(id.to_string()), Query(Vec::new())).await?,
        Page::Effects => admin(AdminRoute::Effects, with_limit(&query)).await?,
        Page::Meters => {
            let mut reports = admin(AdminRoute::MeterReports, with_limit(&query)).await?;
            // The page's empty state says whether any source has a meter at all.
            reports["meters"] = json!(state.meters);
            reports
        }
        Page::Divergences => admin(AdminRoute::Divergences, Query(Vec::new())).await?,
        Page::AuditTrail => admin(AdminRoute::AuditTrail, with_limit(&query)).await?,
        Page::EngineRoom => match admin(AdminRoute::EngineRoom, Query(Vec::new())).await {
            Err(ApiError::EngineRoom(EngineError::Off)) => json!({"enabled": false}),
            other => other?,
        },
        Page::Account { source, customer } => {
            // A Connect customer's page is `acct_…/cus_…`: the customer in its account.
            let (connected, customer) = match customer.split_once('/') {
                Some((account, customer)) => (Some(account), customer),
                None => (None, customer.as_str()),
            };
            let target = target(state, source.clone(), customer, connected)?;
            let at = time_param(&query, "at")?;
            let period = Period::of(at.unwrap_or_else(|| state.clock.now()).into());
            let account = account_value(state, &target, &period).await?;
            let events = events_value(state, &target, DEFAULT_LIMIT, query.first("after")).await?;
            // The page still shows the state now when the fold cannot answer.
            let why = match why_value(
                state,
                &target,
                Cut {
                    at,
                    received_before: None,
                },
            )
            .await
            {
                Ok(why) => why,
                Err(e @ (ApiError::Unavailable(_) | ApiError::Timeout)) => return Err(e),
                Err(e) => json!({"code": e.code(), "detail": e.to_string()}),
            };
            let account_id = (target.source.as_str(), target.customer_id().as_str());
            let allowance = on_held!(state, conn => history::allowance_history(conn, account_id, period.as_str(), state.clock.now()))?;
            let plan = on_held!(state, conn => async {
                match audit::plan_timeline(conn, &state.fold_sources, &state.catalog, (&target.source, target.customer_id())).await {
                    Err(FoldError::Database(e)) => Err(e),
                    other => Ok(other.ok()),
                }
            })?;
            let credits = credits_value(state, &target, at).await?;
            json!({"account": account, "events": events, "why": why, "at": at,
                   "allowance_history": allowance, "plan_timeline": plan, "credits": credits})
        }
    };
    Ok(console::render(&page, &data, &query.0, base))
}

/// The events of `sources` received in one hour, in one status now.
#[derive(Debug, Serialize)]
struct Traffic {
    hour: DateTime<Utc>,
    status: String,
    count: i64,
}

/// The overview's picture: the events received in the last 24 hours by hour and status, read
/// through their `(source, received_at)` index.
async fn traffic(conn: &mut PgConnection, sources: &[String]) -> Result<Vec<Traffic>, sqlx::Error> {
    sqlx::query_as!(
        Traffic,
        r#"
        SELECT date_trunc('hour', received_at) AS "hour!", status, count(*) AS "count!"
        FROM inbox_events
        WHERE source = ANY($1) AND received_at > inbox_now() - interval '24 hours'
        GROUP BY 1, 2
        ORDER BY 1, 2
        "#,
        sources,
    )
    .fetch_all(exec(conn))
    .await
}

fn html(status: StatusCode, body: String) -> Response<Body> {
    answer(status, console::HTML, body)
}

fn answer(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut builder = Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type);
    for (name, value) in console::security_headers() {
        builder = builder.header(name, value);
    }
    builder
        .body(Body::Text(body))
        .expect("static headers always build a response")
}
