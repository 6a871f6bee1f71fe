//! The admin API (docs/api.md, `/v1/admin/…`; docs/design.md §12.5), for a key with the
//! `admin` scope: the overview of what needs a person, events and effects with one event's
//! whole story, the audit's divergences and the audit trail, and replays, each written to the
//! trail under the key's name. Same errors, limits and deadline as the app's routes.

use http::{Method, StatusCode};
use lambda_http::{Body, Request, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::json_response;
use super::answer::{
    authenticate, event_id_param, limit_param, on_held, replayed, require, settle, ApiError, Query,
};
use super::state::ApiState;
use crate::domain::CustomerId;
use crate::domain::EventStatus;
use crate::effects::outbox::EffectStatus;
use crate::handlers::engine_room::EngineError;
use crate::meters::outbox::{self as meter_outbox, ReportStatus};
use crate::operate::{acts, lists, overview, trail, Place};
use crate::platform::api_keys::Scope;

/// What an admin request asks for, once routed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Route {
    Overview,
    Events,
    Event(String),
    ReplayEvent(String),
    ReplayEvents,
    Effects,
    ReplayEffect(String),
    MeterReports,
    ReplayMeterReport(String),
    Divergences,
    AuditTrail,
    EngineRoom,
    EngineRun,
    EngineStep { run: String, step: String },
}

impl Route {
    fn name(&self) -> &'static str {
        match self {
            Self::Overview => "AdminOverview",
            Self::Events => "AdminEvents",
            Self::Event(_) => "AdminEvent",
            Self::ReplayEvent(_) => "AdminReplayEvent",
            Self::ReplayEvents => "AdminReplayEvents",
            Self::Effects => "AdminEffects",
            Self::ReplayEffect(_) => "AdminReplayEffect",
            Self::MeterReports => "AdminMeterReports",
            Self::ReplayMeterReport(_) => "AdminReplayMeterReport",
            Self::Divergences => "AdminDivergences",
            Self::AuditTrail => "AdminAuditTrail",
            Self::EngineRoom => "EngineRoom",
            Self::EngineRun => "EngineRun",
            Self::EngineStep { .. } => "EngineStep",
        }
    }

    fn parameters(&self) -> &'static [&'static str] {
        match self {
            Self::Events => &[
                "status",
                "source",
                "type",
                "customer",
                "provider_event_id",
                "limit",
                "after",
            ],
            Self::Effects => &["status", "limit", "after"],
            Self::MeterReports => &["status", "source", "customer", "limit"],
            Self::AuditTrail => &["limit", "after"],
            _ => &[],
        }
    }

    fn method(&self) -> Method {
        match self {
            Self::ReplayEvent(_)
            | Self::ReplayEvents
            | Self::ReplayEffect(_)
            | Self::ReplayMeterReport(_)
            | Self::EngineRun
            | Self::EngineStep { .. } => Method::POST,
            _ => Method::GET,
        }
    }
}

/// The admin route of a path whose segments after `v1/admin` are `rest` (percent-decoded).
/// Every segment an admin path names is an id the store gave (an event's, an effect's, a
/// report's, a run's) or a step's number: one with a control character names nothing, and is
/// refused before the store is asked (a NUL would fail its statement).
pub(super) fn route(method: &Method, path: &str, rest: &[&str]) -> Result<Route, ApiError> {
    let decode = |s: &str| {
        let decoded = percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map_err(|_| ApiError::bad("bad_path", "a path segment is not UTF-8"))?;
        match decoded.chars().any(char::is_control) {
            true => Err(ApiError::bad(
                "bad_path",
                "a path segment holds a control character; no id can",
            )),
            false => Ok(decoded.into_owned()),
        }
    };
    let route = match rest {
        ["overview"] => Route::Overview,
        ["events"] => Route::Events,
        ["events", "replay"] => Route::ReplayEvents,
        ["events", id] => Route::Event(decode(id)?),
        ["events", id, "replay"] => Route::ReplayEvent(decode(id)?),
        ["effects"] => Route::Effects,
        ["effects", id, "replay"] => Route::ReplayEffect(decode(id)?),
        ["meter-reports"] => Route::MeterReports,
        ["meter-reports", id, "replay"] => Route::ReplayMeterReport(decode(id)?),
        ["divergences"] => Route::Divergences,
        ["audit-trail"] => Route::AuditTrail,
        ["engine-room"] => Route::EngineRoom,
        ["engine-room", "runs"] => Route::EngineRun,
        ["engine-room", "runs", run, "steps", step] => Route::EngineStep {
            run: decode(run)?,
            step: decode(step)?,
        },
        _ => {
            return Err(ApiError::NotFound {
                method: method.clone(),
                path: path.chars().take(200).collect(),
            })
        }
    };
    if *method != route.method() {
        return Err(ApiError::MethodNotAllowed(method.clone()));
    }
    Ok(route)
}

/// A bulk replay's body: which events, by status and, optionally, source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    status: String,
    #[serde(default)]
    source: Option<String>,
}

/// An Engine Room run's body: which scenario.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    scenario: String,
}

/// Answers an admin request (`body` within the size limit).
#[tracing::instrument(skip_all, fields(caller, route))]
pub(super) async fn serve(
    state: &ApiState,
    request: &Request,
    route: Route,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let caller = authenticate(&state.keys, request.headers())?;
    let span = tracing::Span::current();
    span.record("caller", caller.name.as_str());
    span.record("route", route.name());
    require(caller, Scope::Admin)?;
    let query = Query::of(request);
    let body = answer(state, &caller.name, &route, &query, body).await?;
    Ok(json_response(StatusCode::OK, &body))
}

/// The body of an admin route's answer (every one is a 200 with JSON), for the key named
/// `who` (already checked to hold the `admin` scope); the console's pages take theirs here.
pub(super) async fn answer(
    state: &ApiState,
    who: &str,
    route: &Route,
    query: &Query,
    body: &[u8],
) -> Result<Value, ApiError> {
    query.check(route.parameters())?;
    let ok = Ok;
    match route {
        Route::Overview => {
            let overview = on_held!(state, conn => overview::overview(
                conn,
                &state.sources,
                state.silent_hours,
            ))?;
            ok(json!(overview))
        }
        Route::Events => {
            let filter = lists::EventFilter {
                status: query.first("status").map(event_status).transpose()?,
                source: query
                    .first("source")
                    .map(|s| known_source(state, s))
                    .transpose()?,
                event_type: query.first("type").map(str::to_owned),
                customer: query.first("customer").map(str::to_owned),
                provider_event_id: query.first("provider_event_id").map(str::to_owned),
            };
            let limit = limit_param(query.first("limit"))?;
            let before = query.first("after").map(id_cursor).transpose()?;
            let page = on_held!(state, conn => lists::events(conn, &filter, limit, before))?;
            ok(json!(page))
        }
        Route::Event(raw) => {
            let id = event_id_param(raw)?;
            let story = on_held!(state, conn => lists::event_story(conn, id))?
                .ok_or_else(|| ApiError::Missing(format!("no event {id}")))?;
            ok(json!(story))
        }
        Route::ReplayEvent(raw) => {
            let id = event_id_param(raw)?;
            let replay = acts::replay_event(
                &state.pool,
                state.events.as_ref(),
                who,
                acts::Scope::Any,
                id,
            )
            .await
            .map_err(ApiError::Unavailable)?;
            replayed(replay, || format!("no event {id}"))
        }
        Route::ReplayEvents => {
            let bulk: BulkBody = serde_json::from_slice(body).map_err(|_| {
                ApiError::bad(
                    "bad_body",
                    r#"the body is {"status": "dead"|"unprocessable"|"failed", "source"?: "…"}"#,
                )
            })?;
            let status = event_status(&bulk.status)?;
            if !matches!(
                status,
                EventStatus::Dead | EventStatus::Unprocessable | EventStatus::Failed
            ) {
                return Err(ApiError::bad(
                    "bad_status",
                    "a bulk replay takes dead, unprocessable or failed events",
                ));
            }
            let source = bulk
                .source
                .as_deref()
                .map(|s| known_source(state, s))
                .transpose()?;
            let replayed = acts::replay_events(
                &state.pool,
                state.events.as_ref(),
                who,
                status,
                source.as_deref(),
            )
            .await
            .map_err(ApiError::Unavailable)?
            .map_err(|limited| ApiError::RateLimited(limited.retry_after_secs))?;
            ok(json!(replayed))
        }
        Route::Effects => {
            let status = match query.first("status") {
                None => None,
                Some(raw) => Some(EffectStatus::parse(raw).ok_or_else(|| {
                    ApiError::bad("bad_status", "an effect's status is pending, sent or dead")
                })?),
            };
            let limit = limit_param(query.first("limit"))?;
            let after = match query.first("after") {
                None => None,
                Some(raw) => Some(Place::<String>::parse(raw).ok_or_else(|| {
                    ApiError::bad("bad_cursor", "after is the next of an earlier page")
                })?),
            };
            let page =
                on_held!(state, conn => lists::effects(conn, status, limit, after.as_ref()))?;
            ok(json!(page))
        }
        Route::ReplayEffect(id) => {
            let replay = acts::replay_effect(&state.pool, state.effects.as_ref(), who, id)
                .await
                .map_err(ApiError::Unavailable)?;
            replayed(replay, || format!("no effect {}", id.escape_debug()))
        }
        Route::MeterReports => {
            let status = match query.first("status") {
                None => None,
                Some(raw) => Some(ReportStatus::parse(raw).ok_or_else(|| {
                    ApiError::bad(
                        "bad_status",
                        "a meter report's status is pending, sent, dead or withdrawn",
                    )
                })?),
            };
            let source = query
                .first("source")
                .map(|s| known_source(state, s))
                .transpose()?;
            let customer = match (query.first("customer"), &source) {
                (None, _) => None,
                (Some(raw), Some(_)) => Some(
                    CustomerId::parse(raw)
                        .map_err(|e| ApiError::bad("bad_customer", format!("customer: {e}")))?,
                ),
                (Some(_), None) => {
                    return Err(ApiError::bad(
                        "bad_customer",
                        "a customer is named with its source",
                    ))
                }
            };
            let limit = limit_param(query.first("limit"))?;
            let account = source.as_deref().zip(customer.as_ref());
            let reports =
                on_held!(state, conn => meter_outbox::list(conn, status, account, limit))?;
            ok(json!({ "reports": reports }))
        }
        Route::ReplayMeterReport(id) => {
            let replay = acts::replay_meter_report(&state.pool, state.outbox.as_ref(), who, id)
                .await
                .map_err(ApiError::Unavailable)?;
            replayed(replay, || format!("no meter report {}", id.escape_debug()))
        }
        Route::Divergences => {
            let divergences = on_held!(state, conn => lists::divergences(conn))?;
            let differences = on_held!(state, conn => lists::provider_differences(conn))?;
            ok(json!({
                "divergences": divergences,
                "meter_differences": differences.meter_differences,
                "credit_differences": differences.credit_differences,
            }))
        }
        Route::EngineRoom => {
            let room = state.engine_room.as_ref().ok_or(EngineError::Off)?;
            ok(json!({"enabled": true, "scenarios": room.scenarios()}))
        }
        Route::EngineRun => {
            let room = state.engine_room.as_ref().ok_or(EngineError::Off)?;
            let asked: RunBody = serde_json::from_slice(body).map_err(|_| {
                ApiError::bad(
                    "bad_body",
                    r#"the body is {"scenario": "nine-deliveries"|…}"#,
                )
            })?;
            let run = room.start(&asked.scenario)?;
            trail::record(
                &state.pool,
                who,
                "engine_room.run",
                &run.run,
                &json!({"customer": run.customer}),
            )
            .await
            .map_err(ApiError::Unavailable)?;
            ok(json!(run))
        }
        Route::EngineStep { run, step } => {
            let room = state.engine_room.as_ref().ok_or(EngineError::Off)?;
            let step: usize = step
                .parse()
                .map_err(|_| ApiError::bad("bad_step", "a step is its number, from 1"))?;
            let mut conn = state.pool.acquire().await.map_err(ApiError::Unavailable)?;
            ok(json!(room.step(&mut conn, run, step).await?))
        }
        Route::AuditTrail => {
            let limit = limit_param(query.first("limit"))?;
            let before = query.first("after").map(id_cursor).transpose()?;
            let actions = on_held!(state, conn => trail::list(conn, limit + 1, before))?;
            let (actions, next) = crate::operate::cut(actions, limit, |last| last.id.to_string());
            ok(json!({ "actions": actions, "next": next }))
        }
    }
}

fn event_status(raw: &str) -> Result<EventStatus, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::bad(
            "bad_status",
            "an event's status is received, processing, applied, ignored, failed, dead or unprocessable",
        )
    })
}

/// A list's `after` where the list pages by id (the events, the audit trail): the previous
/// page's `next`, a positive whole number; anything else is no cursor of this list.
fn id_cursor(raw: &str) -> Result<i64, ApiError> {
    event_id_param(raw)
        .map_err(|_| ApiError::bad("bad_cursor", "after is the next of an earlier page"))
}

fn known_source(state: &ApiState, raw: &str) -> Result<String, ApiError> {
    state
        .sources
        .iter()
        .find(|(name, _)| name == raw)
        .map(|(name, _)| name.clone())
        .ok_or_else(|| ApiError::UnknownSource(raw.chars().take(100).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(method: Method, path: &str) -> Result<Route, ApiError> {
        let segments: Vec<&str> = path.split('/').collect();
        let at = segments.iter().position(|s| *s == "admin").unwrap();
        route(&method, path, &segments[at + 1..])
    }

    #[test]
    fn an_admin_path_routes_by_its_segments_and_its_method() {
        assert_eq!(
            routed(Method::GET, "/v1/admin/overview").unwrap(),
            Route::Overview
        );
        assert_eq!(
            routed(Method::POST, "/v1/admin/events/replay").unwrap(),
            Route::ReplayEvents,
            "the bulk replay, not an event named replay"
        );
        assert_eq!(
            routed(Method::GET, "/v1/admin/events/7").unwrap(),
            Route::Event("7".into())
        );
        assert_eq!(
            routed(
                Method::POST,
                "/lambda-url/api/v1/admin/effects/eff_1/replay"
            )
            .unwrap(),
            Route::ReplayEffect("eff_1".into())
        );
        assert_eq!(
            routed(
                Method::POST,
                "/v1/admin/engine-room/runs/status.er_1_ab/steps/2"
            )
            .unwrap(),
            Route::EngineStep {
                run: "status.er_1_ab".into(),
                step: "2".into()
            }
        );
        assert!(matches!(
            routed(Method::POST, "/v1/admin/overview"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert!(matches!(
            routed(Method::GET, "/v1/admin/events/7/replay"),
            Err(ApiError::MethodNotAllowed(_))
        ));
        assert!(matches!(
            routed(Method::GET, "/v1/admin/accounts"),
            Err(ApiError::NotFound { .. })
        ));
        for path in [
            "/v1/admin/effects/eff_%00/replay",
            "/v1/admin/meter-reports/mr_%0A/replay",
            "/v1/admin/engine-room/runs/r%00/steps/1",
        ] {
            assert!(
                matches!(
                    routed(Method::POST, path),
                    Err(ApiError::BadRequest {
                        code: "bad_path",
                        ..
                    })
                ),
                "{path}"
            );
        }
    }
}
