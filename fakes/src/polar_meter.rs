//! A fake of Polar's event ingestion, the one route a Polar source's meter reports use
//! (docs/design.md §4.13): `POST /v1/events/ingest`, served in process by wiremock and checked
//! against Polar's published description (testdata/openapi/polar.json, `events:ingest`). It
//! keeps the events it took and answers from them, each behaviour beside the page or source
//! that says so:
//!
//! - an event's `external_id` dedupes it, per organization and with no time window: a repeat
//!   is not inserted again and is counted in the answer's `duplicates` (Polar's
//!   `EventsIngestResponse`: `inserted`, `duplicates`; polar-js
//!   `docs/models/components/eventsingestresponse.md`);
//! - a `timestamp` in Polar's future is refused, 422 "Timestamp must be in the past." (Polar's
//!   `EventCreateBase` validator, `server/polar/event/schemas.py`; the message as
//!   `shared::providers::standard_webhooks::meter` reads it);
//! - Polar has no idempotency layer of its own for ingestion: `external_id` is the only key.
//!
//! The clock and the per-request faults are the fake Stripe's ([`Clock`], [`Faults`]), so a
//! simulation drives both alike; Polar answers a fault with a 5xx whose body is the fault's.
//! This file is the meter's part of Polar's API only (the subscription and meter reads are
//! served elsewhere).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use wiremock::{Request, Respond, ResponseTemplate};

use crate::stripe::{Asked, Clock, Fault, Faults};

/// The ingest route.
const INGEST: &str = "/v1/events/ingest";

/// An event Polar took.
#[derive(Debug, Clone, PartialEq)]
pub struct Ingested {
    pub name: String,
    pub customer_id: String,
    pub external_id: Option<String>,
    pub timestamp: DateTime<Utc>,
    /// `metadata.value`, which a meter summing `value` adds up.
    pub value: f64,
}

#[derive(Default)]
struct State {
    events: Vec<Ingested>,
    /// The external ids taken: Polar keeps one event per organization and `external_id`.
    external_ids: HashMap<String, usize>,
    posts: u32,
    duplicates: u32,
    clock: Option<Clock>,
    decider: Option<Box<dyn Faults>>,
    said: Vec<String>,
}

/// A fake Polar meter ingestion; clones share one organization.
#[derive(Clone, Default)]
pub struct FakePolarMeter(Arc<Mutex<State>>);

impl FakePolarMeter {
    /// Reads time on `clock` from now on (a simulation's, ahead of the wall clock).
    pub fn clocked(&self, clock: Clock) -> &Self {
        self.0.lock().unwrap().clock = Some(clock);
        self
    }

    /// Asks `faults` what goes wrong with each request (`Asked::identifier` is the first
    /// event's `external_id`, `Asked::idempotency_key` none).
    pub fn deciding(&self, faults: impl Faults + 'static) -> &Self {
        self.0.lock().unwrap().decider = Some(Box::new(faults));
        self
    }

    /// Stops asking the decider.
    pub fn no_more_faults(&self) {
        self.0.lock().unwrap().decider = None;
    }

    /// Served as Polar's API, every request checked against Polar's published description.
    #[cfg(feature = "described")]
    pub async fn serve(&self) -> crate::described::ProviderServer {
        let server = crate::described::ProviderServer::start(&crate::described::POLAR).await;
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .and(wiremock::matchers::path(INGEST))
            .respond_with(self.clone())
            .mount(&server)
            .await;
        server
    }

    /// Every event it took, in order.
    pub fn events(&self) -> Vec<Ingested> {
        self.0.lock().unwrap().events.clone()
    }

    /// Requests that reached it, and events in them answered as duplicates.
    pub fn posts(&self) -> (u32, u32) {
        let state = self.0.lock().unwrap();
        (state.posts, state.duplicates)
    }

    /// What it answered each request since the last call, one line each.
    pub fn take_said(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap().said)
    }
}

impl State {
    fn now(&self) -> DateTime<Utc> {
        self.clock.as_ref().map_or_else(Utc::now, |clock| clock())
    }

    /// The ingestion itself: each event inserted unless its `external_id` is taken.
    fn ingest(&mut self, events: &[Value]) -> (u16, Value) {
        let now = self.now();
        let mut parsed = Vec::new();
        let mut refused = Vec::new();
        for (at, event) in events.iter().enumerate() {
            let timestamp = event
                .get("timestamp")
                .and_then(Value::as_str)
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map_or(now, |t| t.to_utc());
            if timestamp > now {
                refused.push(json!({"type": "value_error",
                    "loc": ["body", "events", at, "timestamp"],
                    "msg": "Value error, Timestamp must be in the past.",
                    "input": event.get("timestamp")}));
                continue;
            }
            parsed.push(Ingested {
                name: event["name"].as_str().unwrap_or_default().to_owned(),
                customer_id: event["customer_id"].as_str().unwrap_or_default().to_owned(),
                external_id: event
                    .get("external_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                timestamp,
                value: event
                    .pointer("/metadata/value")
                    .and_then(Value::as_f64)
                    .unwrap_or_default(),
            });
        }
        // A body that fails validation is refused whole (FastAPI's 422), nothing inserted.
        if !refused.is_empty() {
            return (422, json!({"detail": refused}));
        }
        let (mut inserted, mut duplicates) = (0, 0);
        for event in parsed {
            if let Some(id) = &event.external_id {
                if self.external_ids.contains_key(id) {
                    duplicates += 1;
                    continue;
                }
                self.external_ids.insert(id.clone(), self.events.len());
            }
            self.events.push(event);
            inserted += 1;
        }
        self.duplicates += duplicates;
        (200, json!({"inserted": inserted, "duplicates": duplicates}))
    }
}

impl Respond for FakePolarMeter {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut state = self.0.lock().unwrap();
        state.posts += 1;
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let events = body
            .get("events")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let first = events
            .first()
            .and_then(|e| e.get("external_id"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let what = format!("polar event {}", &first[..first.len().min(11)]);
        let asked = Asked {
            endpoint: INGEST,
            identifier: &first,
            idempotency_key: None,
        };
        let fault = state.decider.as_mut().and_then(|d| d.decide(&asked));
        let (status, body, delay) = match fault {
            Some(Fault::Fails(status, body)) => {
                state.said.push(format!("{what}…: {status}, nothing taken"));
                (status, body, None)
            }
            Some(Fault::RateLimited(_)) => {
                state.said.push(format!("{what}…: 429, nothing taken"));
                (429, json!({"detail": "Too many requests"}), None)
            }
            Some(Fault::TakesThenFails(status, body)) => {
                let (taken, _) = state.ingest(&events);
                state
                    .said
                    .push(format!("{what}…: {taken} then answered {status}"));
                (status, body, None)
            }
            Some(Fault::Slow(delay)) => {
                let (status, body) = state.ingest(&events);
                state.said.push(format!(
                    "{what}…: {status} {body}, answered after {delay:?}"
                ));
                (status, body, Some(delay))
            }
            None => {
                let (status, body) = state.ingest(&events);
                state.said.push(format!("{what}…: {status} {body}"));
                (status, body, None)
            }
        };
        let answer = ResponseTemplate::new(status).set_body_json(body);
        match delay {
            Some(delay) => answer.set_delay(delay),
            None => answer,
        }
    }
}

/// The fake itself, asked directly: each behaviour as Polar's pages say.
#[cfg(all(test, feature = "described"))]
mod behaviour {
    use super::*;

    async fn ingest(server: &wiremock::MockServer, events: Value) -> (u16, Value) {
        let answer = reqwest::Client::new()
            .post(format!("{}{INGEST}", server.uri()))
            .json(&json!({"events": events}))
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    fn event(external_id: &str, value: i64, at: DateTime<Utc>) -> Value {
        json!({"name": "api_calls", "customer_id": "992fae2a-2a17-4b7a-8d9e-e287cf90131b",
            "external_id": external_id,
            "timestamp": at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "metadata": {"value": value}})
    }

    #[tokio::test]
    async fn the_fake_dedupes_external_ids_without_a_window_and_refuses_a_future_timestamp() {
        let fake = FakePolarMeter::default();
        let server = fake.serve().await;
        let now = Utc::now();
        assert_eq!(
            ingest(&server, json!([event("bi_1", 3, now)])).await,
            (200, json!({"inserted": 1, "duplicates": 0}))
        );
        // A year later by the fake's clock, the same external id is still a duplicate.
        fake.clocked(Arc::new(move || now + chrono::TimeDelta::days(365)));
        assert_eq!(
            ingest(&server, json!([event("bi_1", 3, now)])).await,
            (200, json!({"inserted": 0, "duplicates": 1}))
        );
        // A compensation is an event of its own, of the negative value.
        assert_eq!(
            ingest(&server, json!([event("bi_2", -3, now)])).await.0,
            200
        );
        let (status, body) = ingest(
            &server,
            json!([event("bi_3", 1, now + chrono::TimeDelta::days(366))]),
        )
        .await;
        assert_eq!(status, 422);
        assert!(body["detail"][0]["msg"]
            .as_str()
            .unwrap()
            .contains("Timestamp must be in the past"));
        // A fault before the ingestion takes nothing; one after it takes the event.
        let mut faults = vec![
            Fault::TakesThenFails(500, json!({"detail": "Internal Server Error"})),
            Fault::Fails(503, json!({"detail": "Service Unavailable"})),
        ];
        fake.deciding(move |_: &Asked<'_>| faults.pop());
        assert_eq!(ingest(&server, json!([event("bi_4", 2, now)])).await.0, 503);
        assert_eq!(ingest(&server, json!([event("bi_4", 2, now)])).await.0, 500);
        assert_eq!(
            ingest(&server, json!([event("bi_4", 2, now)])).await,
            (200, json!({"inserted": 0, "duplicates": 1}))
        );
        let values: Vec<f64> = fake.events().iter().map(|e| e.value).collect();
        assert_eq!(values, [3.0, -3.0, 2.0]);
    }
}
