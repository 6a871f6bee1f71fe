//! A local receiver of effects, as the app would run one (`inboxctl listen`, and the tests'
//! endpoint): verifies each request's Standard Webhooks signature, answers 204 (401 with the
//! reason when the signature fails), keeps what it received by `webhook-id`, and applies it
//! as docs/effects.md tells an app to ([`AppState`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::effects::type_carries_state;
use crate::signing::standard_webhooks::{Verifier, ID_HEADER};

/// The port `inboxctl listen` takes by default (scripts/dev points the webhook sink at it).
pub const DEFAULT_PORT: u16 = 61920;
/// The signature timestamp tolerance, as an app would set it.
pub const TOLERANCE: Duration = Duration::from_secs(300);
/// The largest body accepted.
const MAX_BODY: usize = 1 << 20;

/// One verified delivery.
#[derive(Debug, Clone)]
pub struct Received {
    pub webhook_id: String,
    /// The body as received, byte for byte.
    pub raw: Bytes,
    /// The body as JSON (`Null` when it is not).
    pub body: Value,
}

/// What the receiver heard, in order, for a caller that prints it.
#[derive(Debug, Clone)]
pub enum Heard {
    /// A verified delivery, and what applying it did.
    Effect(Received, Applied),
    /// A request refused, and why (e.g. a signature that does not match).
    Refused { status: StatusCode, reason: String },
}

/// What an app that follows docs/effects.md holds once it applied what it received. A kind
/// that carries a state is applied latest-`sequence`-wins: the account's state per account
/// (`data.account`, and `plan` for `billing.plan_changed`), a subscription's per subscription.
/// Any other kind is a fact (a grant, a payment, a deletion, a kind it does not know), applied
/// once by its id whatever its sequence, since retries deliver an older one late.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppState {
    /// Per account (`source/customer`): the sequence of the newest effect applied to its
    /// state, and that effect's `data.account`.
    pub accounts: BTreeMap<String, (i64, Value)>,
    /// Per subscription (`source/id`): the sequence and the state of the newest
    /// `billing.subscription_updated` applied.
    pub subscriptions: BTreeMap<String, (i64, Value)>,
    /// The facts applied, by effect id, each once: the body.
    pub facts: BTreeMap<String, Value>,
    /// Effects of a state kind not applied because a newer state was (their ids).
    pub older: Vec<String>,
    /// The ids of every effect applied (state or fact): a delivery of one again is a copy.
    pub seen: BTreeSet<String>,
}

/// What applying one delivery did, by the rules of docs/effects.md.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A state kind, newer than the state held: it is the state now.
    State,
    /// A fact, applied for the first time (whatever its sequence).
    Fact,
    /// An effect whose id was applied before (the dispatcher sent it again): nothing applied.
    Copy,
    /// A state kind older than the state held (sequence `held`): not applied.
    Older { held: i64 },
    /// A body with no `id` or `type`: nothing to apply.
    NotAnEffect,
}

impl AppState {
    /// Applies one effect's body as the contract says, and says what that did.
    pub fn apply(&mut self, body: &Value) -> Applied {
        let text = |pointer: &str| body.pointer(pointer).and_then(Value::as_str);
        let (Some(id), Some(kind)) = (text("/id"), text("/type")) else {
            return Applied::NotAnEffect;
        };
        // Deduplicate on the id first: a copy is neither older nor newer, it is the same.
        if !self.seen.insert(id.to_owned()) {
            return Applied::Copy;
        }
        let sequence = body
            .pointer("/data/sequence")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let source = text("/data/source").unwrap_or_default();
        let account = format!("{source}/{}", text("/data/customer_id").unwrap_or_default());
        let newer = |held: Option<&(i64, Value)>| held.is_none_or(|(seq, _)| *seq < sequence);
        // `data.account` is the account after the change: a state, whatever the kind that
        // carries it (the credits kinds carry none).
        let held_account = self.accounts.get(&account).map(|(seq, _)| *seq);
        let account_newer = newer(self.accounts.get(&account));
        if let (true, Some(state)) = (account_newer, body.pointer("/data/account")) {
            self.accounts.insert(account, (sequence, state.clone()));
        }
        if !type_carries_state(kind) {
            self.facts.insert(id.to_owned(), body.clone());
            return Applied::Fact;
        }
        let held = match body
            .pointer("/data/subscription/id")
            .and_then(Value::as_str)
        {
            Some(subscription) => {
                let key = format!("{source}/{subscription}");
                let held = self.subscriptions.get(&key).map(|(seq, _)| *seq);
                if newer(self.subscriptions.get(&key)) {
                    let state = body["data"]["subscription"].clone();
                    self.subscriptions.insert(key, (sequence, state));
                    None
                } else {
                    held
                }
            }
            None if account_newer => None,
            None => held_account,
        };
        match held {
            None => Applied::State,
            Some(held) => {
                self.older.push(id.to_owned());
                Applied::Older { held }
            }
        }
    }
}

struct Shared {
    verifier: Verifier,
    received: Mutex<Vec<Received>>,
    app: Mutex<AppState>,
    refused: AtomicUsize,
    /// Answer every verified request with this status instead of 204 (an app that fails).
    answer: Mutex<Option<StatusCode>>,
    /// Answer the next verified requests carrying these `webhook-id`s with the status, once
    /// each (a handler that fails on one delivery).
    fail_once: Mutex<HashMap<String, StatusCode>>,
    heard: Option<mpsc::UnboundedSender<Heard>>,
}

/// A running receiver; it stops when dropped.
pub struct Listener {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Listens on `addr` (port 0: any free port), verifying with any of `keys`.
    pub async fn start(addr: SocketAddr, keys: Vec<Vec<u8>>) -> std::io::Result<Self> {
        Self::start_with(addr, keys, None).await
    }

    /// As [`Listener::start`], and tells `heard` of every request, in order.
    pub async fn start_with(
        addr: SocketAddr,
        keys: Vec<Vec<u8>>,
        heard: Option<mpsc::UnboundedSender<Heard>>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            verifier: Verifier::new(keys, TOLERANCE),
            received: Mutex::new(Vec::new()),
            app: Mutex::new(AppState::default()),
            refused: AtomicUsize::new(0),
            answer: Mutex::new(None),
            fail_once: Mutex::new(HashMap::new()),
            heard,
        });
        let task = tokio::spawn(serve(listener, shared.clone()));
        Ok(Self { addr, shared, task })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL a webhook sink points at.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Every verified delivery so far, in order of arrival.
    pub fn received(&self) -> Vec<Received> {
        lock(&self.shared.received).clone()
    }

    /// How many verified deliveries carried this `webhook-id`.
    pub fn count(&self, webhook_id: &str) -> usize {
        lock(&self.shared.received)
            .iter()
            .filter(|r| r.webhook_id == webhook_id)
            .count()
    }

    /// How many requests were refused (bad signature, not a POST, too large).
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// From now on, answer verified requests with `status` and keep nothing (an app whose
    /// handler fails); `None`: back to 204.
    pub fn answer_with(&self, status: Option<StatusCode>) {
        *lock(&self.shared.answer) = status;
    }

    /// Answer the next verified delivery of `webhook_id` with `status` and keep nothing;
    /// later deliveries of it are kept.
    pub fn fail_once(&self, webhook_id: &str, status: StatusCode) {
        lock(&self.shared.fail_once).insert(webhook_id.to_owned(), status);
    }

    /// What the app holds after applying every kept delivery as docs/effects.md says.
    pub fn app(&self) -> AppState {
        lock(&self.shared.app).clone()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(error = %error, "listen: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(handle(&shared, request).await) }
            });
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %error, "listen: connection ended");
            }
        });
    }
}

async fn handle(shared: &Shared, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let (status, reason) = match receive(shared, request).await {
        Ok(received) => {
            let failing = *lock(&shared.answer);
            let failing_once = lock(&shared.fail_once).remove(&received.webhook_id);
            if let Some(status) = failing.or(failing_once) {
                return answer(status, "the app's handler failed");
            }
            lock(&shared.received).push(received.clone());
            let applied = lock(&shared.app).apply(&received.body);
            if let Some(heard) = &shared.heard {
                let _ = heard.send(Heard::Effect(received, applied));
            }
            return answer(StatusCode::NO_CONTENT, "");
        }
        Err(refusal) => refusal,
    };
    shared.refused.fetch_add(1, Ordering::SeqCst);
    if let Some(heard) = &shared.heard {
        let _ = heard.send(Heard::Refused {
            status,
            reason: reason.clone(),
        });
    }
    answer(status, &reason)
}

/// Reads and verifies one request; a refusal is its status and reason.
async fn receive(
    shared: &Shared,
    request: Request<Incoming>,
) -> Result<Received, (StatusCode, String)> {
    if request.method() != Method::POST {
        return Err((
            StatusCode::METHOD_NOT_ALLOWED,
            "effects arrive by POST".into(),
        ));
    }
    let (parts, body) = request.into_parts();
    let raw = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|_| {
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                "the body could not be read (over 1 MiB?)".to_owned(),
            )
        })?
        .to_bytes();
    shared
        .verifier
        .check(&parts.headers, &raw, chrono::Utc::now())
        .map_err(|e| (StatusCode::UNAUTHORIZED, e.to_string()))?;
    let webhook_id = parts
        .headers
        .get(ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    Ok(Received {
        webhook_id,
        raw,
        body,
    })
}

fn answer(status: StatusCode, reason: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(reason.to_owned())));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::standard_webhooks::signature;

    fn effect(id: &str, kind: &str, sequence: i64, own: Value) -> Value {
        let mut data = serde_json::json!({"source": "kinde", "customer_id": "kc_1",
            "sequence": sequence, "account": {"plan": format!("at {sequence}")}});
        data.as_object_mut()
            .unwrap()
            .extend(own.as_object().unwrap().clone());
        serde_json::json!({"id": id, "type": kind, "data": data})
    }

    #[test]
    fn an_app_keeps_the_newest_state_and_every_fact_whatever_its_sequence() {
        let mut app = AppState::default();
        let team = effect(
            "e4",
            "billing.plan_changed",
            4,
            serde_json::json!({"plan": "team"}),
        );
        assert_eq!(app.apply(&team), Applied::State);
        let grant = serde_json::json!({"grant": {"plan": "pro", "amount": 500}});
        let grant = effect("e2", "billing.allowance_granted", 2, grant);
        assert_eq!(app.apply(&grant), Applied::Fact, "a late fact is applied");
        let pro = effect(
            "e3",
            "billing.plan_changed",
            3,
            serde_json::json!({"plan": "pro"}),
        );
        assert_eq!(app.apply(&pro), Applied::Older { held: 4 });
        let sub = serde_json::json!({"subscription": {"id": "s1", "status": "active"}});
        let sub = effect("e1", "billing.subscription_updated", 1, sub);
        assert_eq!(app.apply(&sub), Applied::State);
        app.apply(&effect(
            "e9",
            "billing.allowance_exhausted",
            1,
            serde_json::json!({}),
        ));
        // Copies, of a state and of a fact: neither applied again nor older.
        assert_eq!(app.apply(&team), Applied::Copy);
        assert_eq!(app.apply(&grant), Applied::Copy);
        assert_eq!(
            app.apply(&serde_json::json!({"id": "e5"})),
            Applied::NotAnEffect
        );
        assert!(app.facts.contains_key("e2"), "a late grant is applied");
        assert!(
            app.facts.contains_key("e9"),
            "a kind it does not know is a fact"
        );
        assert_eq!(
            app.accounts["kinde/kc_1"].0, 4,
            "the account's newest state holds"
        );
        assert_eq!(
            app.older,
            ["e3"],
            "a late plan change is older than the state held"
        );
        assert_eq!(
            app.subscriptions["kinde/s1"].0, 1,
            "a subscription's state is its own"
        );
    }

    /// docs/effects.md's table of states and facts is the rule an app follows: it names every
    /// kind this build writes, each once, as the receiver applies it.
    #[test]
    fn docs_effects_table_names_every_kind_as_the_receiver_applies_it() {
        use crate::domain::effect::Kind;
        let doc = include_str!("../../../docs/effects.md");
        let row = |are: &str| -> Vec<String> {
            let line = doc
                .lines()
                .find(|l| l.starts_with("| `billing.") && l.contains(are))
                .unwrap_or_else(|| panic!("docs/effects.md has a row of kinds that are {are}"));
            let kinds = line.split('|').nth(1).unwrap();
            kinds
                .split('`')
                .filter(|k| k.starts_with("billing."))
                .map(str::to_owned)
                .collect()
        };
        let (states, facts) = (row("| a state"), row("| a fact"));
        let mut named: Vec<&String> = states.iter().chain(&facts).collect();
        named.sort();
        named.dedup();
        assert_eq!(named.len(), states.len() + facts.len(), "each kind once");
        assert_eq!(named.len(), Kind::ALL.len(), "every kind: {named:?}");
        for (kinds, state) in [(&states, true), (&facts, false)] {
            for kind in kinds {
                let known = Kind::parse(kind).unwrap_or_else(|| panic!("{kind} is a kind"));
                assert_eq!(known.carries_state(), state, "{kind}");
                let mut app = AppState::default();
                let applied = app.apply(&effect("e1", kind, 1, serde_json::json!({})));
                let expected = if state { Applied::State } else { Applied::Fact };
                assert_eq!(applied, expected, "{kind}");
            }
        }
    }

    #[tokio::test]
    async fn a_signed_request_is_kept_and_a_forged_one_refused_with_its_reason() {
        let listener = Listener::start(([127, 0, 0, 1], 0).into(), vec![b"key".to_vec()])
            .await
            .unwrap();
        let http = reqwest::Client::new();
        let body = br#"{"id":"eff_1","type":"billing.plan_changed"}"#;
        let now = chrono::Utc::now().timestamp();
        let post = |sig: String| {
            http.post(listener.url())
                .header("webhook-id", "eff_1")
                .header("webhook-timestamp", now.to_string())
                .header("webhook-signature", sig)
                .body(body.to_vec())
                .send()
        };

        let good = post(signature(b"key", "eff_1", now, body)).await.unwrap();
        let forged = post(signature(b"other", "eff_1", now, body)).await.unwrap();

        assert_eq!(good.status(), StatusCode::NO_CONTENT);
        assert_eq!(forged.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(forged.text().await.unwrap(), "signature does not match");
        assert_eq!(listener.count("eff_1"), 1);
        assert_eq!(listener.refused(), 1);
        assert_eq!(listener.received()[0].body["type"], "billing.plan_changed");
    }
}
