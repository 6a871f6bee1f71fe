//! A fake Kinde: the token endpoint and the billing parts of Kinde's Management API the
//! project calls (docs/design.md §4.13, §6.1), over the customers, plans, entitlements and
//! agreements a test seeds, each behaviour beside the page of Kinde's documentation or its
//! Management API description (kinde-oss `api/openapi.yaml`, pinned in
//! testdata/openapi/kinde.json) that says so:
//!
//! - `POST /oauth2/token`: the client-credentials grant of one M2M application, a token that
//!   lives `expires_in` seconds; another client, or a wrong secret, `invalid_client`;
//! - `GET /api/v1/billing/entitlements`: a customer's entitlements paged by `page_size` and
//!   `starting_after`, `has_more`, its plans with `expand=plans`;
//! - `GET /api/v1/billing/agreements`: a customer's agreements, filtered by `feature_code`;
//! - `POST /api/v1/billing/meter_usage`: usage recorded against an agreement;
//! - a call with no token, or an expired one, 401; Kinde's errors as
//!   `{"errors": [{code, message}]}`; 429 with `RateLimit-Reset` when a test gives it a limit
//!   (Kinde publishes none).
//!
//! A test adds faults on top ([`Fault`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use wiremock::matchers::{method, path_regex};
use wiremock::{Mock, Request, Respond, ResponseTemplate};

use crate::described::{ProviderServer, KINDE};
use crate::traffic::{Fault, Metered, Traffic};

/// The token's lifetime in Kinde's example answer to the client-credentials grant,
/// `"expires_in": 86399` (docs.kinde.com/developer-tools/kinde-api/access-token-for-api).
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(86_399);
/// "maximum page size of 500 per request to API GET endpoints that use the `page_size`
/// parameter, additional results can be requested using the `page_size` and `next_token`
/// parameters" (docs.kinde.com/developer-tools/kinde-api/api-rate-limits); the billing lists
/// page by `starting_after` (the description's `getBillingEntitlements`), 10 when not given.
const PAGE_SIZE: usize = 10;
const MAX_PAGE_SIZE: usize = 500;

#[derive(Default)]
struct Customer {
    plans: Vec<Value>,
    entitlements: Vec<Value>,
    agreements: Vec<Value>,
}

#[derive(Default)]
struct State {
    client_id: String,
    client_secret: String,
    lifetime: Option<Duration>,
    /// Each token issued and when it expires.
    tokens: HashMap<String, Instant>,
    customers: HashMap<String, Customer>,
    usage: Vec<Value>,
}

/// A fake Kinde business with one M2M application; clones share it.
#[derive(Clone)]
pub struct FakeKinde {
    state: Arc<Mutex<State>>,
    traffic: Arc<Mutex<Traffic>>,
}

impl FakeKinde {
    /// A business whose M2M application is `client_id` with `client_secret`.
    pub fn new(client_id: &str, client_secret: &str) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                client_id: client_id.to_owned(),
                client_secret: client_secret.to_owned(),
                ..State::default()
            })),
            // "Kinde may rate limit incoming traffic … you might see error responses with code
            // 429" and publishes no number (docs.kinde.com/developer-tools/kinde-api/api-rate-limits).
            traffic: Arc::new(Mutex::new(Traffic::new(None))),
        }
    }

    /// The lifetime of the tokens it issues from now on (Kinde's is [`TOKEN_LIFETIME`]).
    pub fn token_lifetime(&self, lifetime: Duration) -> &Self {
        self.state.lock().unwrap().lifetime = Some(lifetime);
        self
    }

    /// Every token issued so far expires now (a test's "a day later").
    pub fn expire_tokens(&self) {
        let now = Instant::now();
        for until in self.state.lock().unwrap().tokens.values_mut() {
            *until = now;
        }
    }

    /// Tokens issued so far.
    pub fn tokens_issued(&self) -> usize {
        self.state.lock().unwrap().tokens.len()
    }

    /// Makes `customer` a billing customer on `plans` (`[{code, subscribed_on}]`).
    pub fn customer(&self, customer: &str, plans: Value) -> &Self {
        let mut state = self.state.lock().unwrap();
        let held = state.customers.entry(customer.to_owned()).or_default();
        held.plans = plans.as_array().cloned().unwrap_or_default();
        self
    }

    /// Lists `listed` (`[{id, feature_code, entitlement_limit_max, …}]`) as `customer`'s
    /// entitlements, in place of what it listed.
    pub fn entitlements(&self, customer: &str, listed: Value) -> &Self {
        let mut state = self.state.lock().unwrap();
        let held = state.customers.entry(customer.to_owned()).or_default();
        held.entitlements = listed.as_array().cloned().unwrap_or_default();
        self
    }

    /// Gives `customer` `agreement` (`{id, plan_code, expires_on, entitlements: [{feature_code,
    /// entitlement_id}], …}`).
    pub fn agreement(&self, customer: &str, agreement: Value) -> &Self {
        let mut state = self.state.lock().unwrap();
        let held = state.customers.entry(customer.to_owned()).or_default();
        held.agreements.push(agreement);
        self
    }

    /// The usage records it took, as sent.
    pub fn usage(&self) -> Vec<Value> {
        self.state.lock().unwrap().usage.clone()
    }

    /// Served as Kinde's API, every request checked against Kinde's description. A test's own
    /// mock of a route comes first.
    pub async fn serve(&self) -> ProviderServer {
        let server = ProviderServer::start(&KINDE).await;
        self.mount(&server).await;
        server
    }

    /// Mounts its routes on `server` (one of `inboxctl fakes`'s, say).
    pub async fn mount(&self, server: &wiremock::MockServer) {
        Mock::given(method("POST"))
            .and(path_regex(r"^/(oauth2/token|api/v1/billing/meter_usage)$"))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(server)
            .await;
        Mock::given(method("GET"))
            .and(path_regex(r"^/api/v1/billing/(entitlements|agreements)$"))
            .respond_with(self.clone())
            .with_priority(10)
            .mount(server)
            .await;
    }
}

/// The Management API's errors: `{"errors": [{"code", "message"}]}` (the description's
/// `error_response`).
fn error(status: u16, code: &str, message: &str) -> ResponseTemplate {
    ResponseTemplate::new(status)
        .set_body_json(json!({"errors": [{"code": code, "message": message}]}))
}

/// A success as the billing endpoints answer it: `{"code": "OK", "message": "Success", …}`
/// (the description's `get_billing_entitlements_response`, `create_meter_usage_record_response`).
fn success(mut body: Value) -> ResponseTemplate {
    body["code"] = "OK".into();
    body["message"] = "Success".into();
    ResponseTemplate::new(200).set_body_json(body)
}

impl Respond for FakeKinde {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let path = request.url.path().to_owned();
        let (taken, fault) = {
            let mut traffic = self.traffic.lock().unwrap();
            (traffic.arrive(), traffic.fault(&path))
        };
        let refused = match (&taken, &fault) {
            (Err(refused), _) => Some(refused.retry_after),
            (_, Some(Fault::RateLimited(secs))) => Some(*secs),
            _ => None,
        };
        if let Some(reset) = refused {
            // "Graceful handling involves monitoring for 429 status codes and triggering a retry
            // method. The header `RateLimit-Reset` will return the number of seconds until the
            // rate limit is reset." (docs.kinde.com/developer-tools/kinde-api/api-rate-limits)
            return error(429, "TOO_MANY_REQUESTS", "Too many requests")
                .insert_header("RateLimit-Reset", reset.to_string().as_str());
        }
        let mut state = self.state.lock().unwrap();
        let (answer, delay) = match fault {
            Some(Fault::Fails(status)) => return error(status, "ERROR", "An error occurred"),
            Some(Fault::TakesThenFails(status)) => {
                state.answer(&path, request);
                return error(status, "ERROR", "An error occurred");
            }
            Some(Fault::Slow(delay)) => (state.answer(&path, request), Some(delay)),
            Some(Fault::RateLimited(_)) | None => (state.answer(&path, request), None),
        };
        match delay {
            Some(delay) => answer.set_delay(delay),
            None => answer,
        }
    }
}

impl State {
    fn answer(&mut self, path: &str, request: &Request) -> ResponseTemplate {
        if path == "/oauth2/token" {
            return self.token(request);
        }
        // A Management API call carries the M2M token as a bearer; one missing or expired is
        // refused (docs.kinde.com/developer-tools/kinde-api/access-token-for-api: "the token
        // … expires", `expires_in`).
        let bearer = request
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let valid = bearer
            .and_then(|t| self.tokens.get(t))
            .is_some_and(|until| Instant::now() < *until);
        if !valid {
            return error(
                401,
                "TOKEN_INVALID",
                "Invalid credentials used to access API",
            );
        }
        let query: HashMap<String, String> = request.url.query_pairs().into_owned().collect();
        match path {
            "/api/v1/billing/entitlements" => self.entitlements(&query),
            "/api/v1/billing/agreements" => self.agreements(&query),
            _ => self.meter_usage(request),
        }
    }

    /// The client-credentials grant (docs.kinde.com/developer-tools/kinde-api/access-token-for-api):
    /// `grant_type=client_credentials`, the application's `client_id` and `client_secret`, the
    /// `audience` `https://<business>.kinde.com/api`; answered `{access_token, expires_in,
    /// scope, token_type}`. A wrong client is `invalid_client`, 401 (RFC 6749 §5.2, which
    /// Kinde's OAuth 2.0 endpoints follow).
    fn token(&mut self, request: &Request) -> ResponseTemplate {
        let form: HashMap<String, String> = url::form_urlencoded::parse(&request.body)
            .into_owned()
            .collect();
        let field = |k: &str| form.get(k).map(String::as_str).unwrap_or_default();
        if field("grant_type") != "client_credentials" {
            return ResponseTemplate::new(400).set_body_json(json!({
                "error": "unsupported_grant_type",
                "error_description": "The authorization grant type is not supported by the authorization server."}));
        }
        if field("client_id") != self.client_id || field("client_secret") != self.client_secret {
            return ResponseTemplate::new(401).set_body_json(json!({
                "error": "invalid_client",
                "error_description": "Client authentication failed (e.g., unknown client, no client authentication included, or unsupported authentication method)."}));
        }
        let lifetime = self.lifetime.unwrap_or(TOKEN_LIFETIME);
        let token = format!("eyJhbGciOiJSUzI1NiJ9.m2m.{}", self.tokens.len() + 1);
        self.tokens.insert(token.clone(), Instant::now() + lifetime);
        ResponseTemplate::new(200).set_body_json(json!({
            "access_token": token, "expires_in": lifetime.as_secs(),
            "scope": "read:billing_entitlements read:billing_agreements create:meter_usage",
            "token_type": "bearer"}))
    }

    /// One page of a customer's entitlements, after `starting_after`, `page_size` long, with
    /// `has_more`; its plans when `expand=plans` (the description's `getBillingEntitlements`).
    /// A customer Kinde does not bill is not found.
    fn entitlements(&self, query: &HashMap<String, String>) -> ResponseTemplate {
        let Some(customer) = query.get("customer_id").and_then(|c| self.customers.get(c)) else {
            return error(404, "CUSTOMER_NOT_FOUND", "Customer not found");
        };
        let size = match query.get("page_size").map(|s| s.parse::<usize>()) {
            None => PAGE_SIZE,
            Some(Ok(n)) if (1..=MAX_PAGE_SIZE).contains(&n) => n,
            Some(_) => {
                return error(
                    400,
                    "INVALID_PAGE_SIZE",
                    "page_size must be between 1 and 500",
                )
            }
        };
        let start = match query.get("starting_after") {
            Some(after) => match customer
                .entitlements
                .iter()
                .position(|e| e["id"] == **after)
            {
                Some(i) => i + 1,
                None => {
                    return error(
                        400,
                        "INVALID_REQUEST",
                        "starting_after names no entitlement",
                    )
                }
            },
            None => 0,
        };
        let page: Vec<&Value> = customer
            .entitlements
            .iter()
            .skip(start)
            .take(size)
            .collect();
        let mut body = json!({
            "has_more": start + page.len() < customer.entitlements.len(),
            "entitlements": page,
        });
        if query.get("expand").map(String::as_str) == Some("plans") {
            body["plans"] = customer.plans.clone().into();
        }
        success(body)
    }

    /// A customer's agreements, those including `feature_code` when given (the description's
    /// `getBillingAgreements`).
    fn agreements(&self, query: &HashMap<String, String>) -> ResponseTemplate {
        let Some(customer) = query.get("customer_id").and_then(|c| self.customers.get(c)) else {
            return error(404, "CUSTOMER_NOT_FOUND", "Customer not found");
        };
        let listed: Vec<&Value> = customer
            .agreements
            .iter()
            .filter(|a| {
                query.get("feature_code").is_none_or(|code| {
                    a["entitlements"]
                        .as_array()
                        .is_some_and(|es| es.iter().any(|e| e["feature_code"] == **code))
                })
            })
            .collect();
        success(json!({"has_more": false, "agreements": listed}))
    }

    /// A usage record against an agreement the business has (the description's
    /// `createMeterUsageRecord`: `customer_agreement_id`, `billing_feature_code`, `meter_value`,
    /// `meter_usage_timestamp`, `meter_type_code`); Kinde answers no record id.
    fn meter_usage(&mut self, request: &Request) -> ResponseTemplate {
        let Ok(record) = serde_json::from_slice::<Value>(&request.body) else {
            return error(400, "INVALID_REQUEST", "The body is not JSON");
        };
        let known = self.customers.values().any(|c| {
            c.agreements
                .iter()
                .any(|a| a["id"] == record["customer_agreement_id"])
        });
        if !known {
            return error(400, "AGREEMENT_NOT_FOUND", "Customer agreement not found");
        }
        self.usage.push(record);
        success(json!({}))
    }
}

impl Metered for FakeKinde {
    fn traffic(&self) -> &Mutex<Traffic> {
        &self.traffic
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn token(server: &ProviderServer, secret: &str) -> (u16, Value) {
        let answer = reqwest::Client::new()
            .post(format!("{}/oauth2/token", server.uri()))
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", "m2m_id"),
                ("client_secret", secret),
                ("audience", &format!("{}/api", server.uri())),
            ])
            .send()
            .await
            .unwrap();
        (answer.status().as_u16(), answer.json().await.unwrap())
    }

    async fn entitlements(server: &ProviderServer, token: &str, query: &str) -> (u16, Value) {
        let answer = reqwest::Client::new()
            .get(format!(
                "{}/api/v1/billing/entitlements?{query}",
                server.uri()
            ))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (answer.status().as_u16(), answer.json().await.unwrap())
    }

    #[tokio::test]
    async fn a_token_serves_until_it_expires_and_the_entitlements_page_by_starting_after() {
        let fake = FakeKinde::new("m2m_id", "m2m_secret");
        fake.customer(
            "kp_1",
            json!([{"code": "pro", "subscribed_on": "2026-01-01T00:00:00Z"}]),
        );
        fake.entitlements(
            "kp_1",
            (1..=3)
                .map(|i| json!({"id": format!("ent_{i}"), "feature_code": format!("f{i}")}))
                .collect(),
        );
        let server = fake.serve().await;
        assert_eq!(token(&server, "wrong").await.1["error"], "invalid_client");
        let (status, issued) = token(&server, "m2m_secret").await;
        assert_eq!((status, issued["expires_in"].as_u64()), (200, Some(86_399)));
        let bearer = issued["access_token"].as_str().unwrap();
        let (_, first) =
            entitlements(&server, bearer, "customer_id=kp_1&expand=plans&page_size=2").await;
        assert_eq!(first["has_more"], true);
        assert_eq!(first["plans"][0]["code"], "pro");
        let (_, last) = entitlements(
            &server,
            bearer,
            "customer_id=kp_1&page_size=2&starting_after=ent_2",
        )
        .await;
        assert_eq!(
            (
                last["has_more"].as_bool(),
                last["entitlements"][0]["id"].as_str()
            ),
            (Some(false), Some("ent_3"))
        );
        assert_eq!(
            entitlements(&server, bearer, "customer_id=kp_none").await.0,
            404
        );
        fake.expire_tokens();
        let (status, body) = entitlements(&server, bearer, "customer_id=kp_1").await;
        assert_eq!(status, 401);
        assert!(body["errors"][0]["code"].is_string());
    }

    #[tokio::test]
    async fn over_a_limit_kinde_answers_429_with_ratelimit_reset() {
        let fake = FakeKinde::new("m2m_id", "m2m_secret");
        fake.rate_limit(1);
        let server = fake.serve().await;
        token(&server, "m2m_secret").await;
        let answer = reqwest::Client::new()
            .post(format!("{}/oauth2/token", server.uri()))
            .form(&[
                ("grant_type", "client_credentials"),
                ("client_id", "m2m_id"),
                ("client_secret", "m2m_secret"),
                ("audience", "x"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 429);
        assert!(answer.headers().contains_key("ratelimit-reset"));
        assert_eq!((fake.over_limit(), fake.tokens_issued()), (1, 1));
    }
}
