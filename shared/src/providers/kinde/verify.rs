//! Kinde: the body is a JWT signed RS256 with a key from the account's JWKS.

use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use base64::Engine;
use chrono::{DateTime, Utc};
use http::HeaderMap;
use jsonwebtoken::jwk::AlgorithmParameters;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use super::jwks::JwksCache;
use crate::domain::{ContentHash, CustomerId, DedupeKey, EventMeta, ProviderTime, VerifiedEvent};
use crate::providers::common::str_at;
use crate::providers::Verify;
use crate::signing::{check_tolerance, header, AuthError};
use crate::BoxFuture;

pub const ID_HEADER: &str = "webhook-id";

/// Claims that describe the delivery (when it was signed), not the event: a retry
/// re-signed later is still the same event.
const ENVELOPE_CLAIMS: &[&str] = &["timestamp", "iat", "exp", "nbf", "jti"];

pub struct KindeVerifier {
    jwks: JwksCache,
    tolerance: Duration,
}

/// The `alg` and `kid` a token claims, read before any key is chosen so that `none` and
/// HMAC algorithms are refused by name.
fn token_header(token: &str) -> Result<(String, Option<String>), AuthError> {
    let encoded = token
        .split('.')
        .next()
        .ok_or(AuthError::Malformed("token"))?;
    let bytes = BASE64URL
        .decode(encoded)
        .map_err(|_| AuthError::Malformed("token header"))?;
    let header: Value =
        serde_json::from_slice(&bytes).map_err(|_| AuthError::Malformed("token header"))?;
    let alg = str_at(&header, "/alg")
        .ok_or(AuthError::Malformed("token header: no alg"))?
        .to_owned();
    let kid = str_at(&header, "/kid").map(str::to_owned);
    Ok((alg, kid))
}

impl Verify for KindeVerifier {
    fn verify<'a>(
        &'a self,
        headers: &'a HeaderMap,
        body: &'a [u8],
        now: DateTime<Utc>,
    ) -> BoxFuture<'a, Result<VerifiedEvent, AuthError>> {
        Box::pin(self.check(headers, body, now))
    }
}

impl KindeVerifier {
    pub fn new(jwks: JwksCache, tolerance: Duration) -> Self {
        Self { jwks, tolerance }
    }

    /// Checks the token's algorithm, key, signature and time, then reads the claims.
    pub async fn check(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedEvent, AuthError> {
        let token = std::str::from_utf8(body)
            .map_err(|_| AuthError::Malformed("token: body is not text"))?
            .trim();
        if token.split('.').count() != 3 {
            return Err(AuthError::Malformed("token: the body is not a JWT"));
        }
        let (alg, kid) = token_header(token)?;
        if alg != "RS256" {
            return Err(AuthError::AlgorithmNotAllowed(alg));
        }
        let kid = kid.ok_or(AuthError::Missing("token kid"))?;
        let jwk = self.jwks.key(&kid, Instant::now()).await?;
        if !matches!(jwk.algorithm, AlgorithmParameters::RSA(_)) {
            return Err(AuthError::WrongKeyType(kid));
        }
        let key = DecodingKey::from_jwk(&jwk).map_err(|_| AuthError::WrongKeyType(kid.clone()))?;
        let mut validation = Validation::new(Algorithm::RS256);
        // Kinde's tokens carry their send time in `timestamp`, checked below against our
        // tolerance; no audience is set.
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_aud = false;
        let claims = jsonwebtoken::decode::<Value>(token, &key, &validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::InvalidSignature => AuthError::BadSignature,
                jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => {
                    AuthError::AlgorithmNotAllowed(alg.clone())
                }
                _ => AuthError::Malformed("token"),
            })?
            .claims;
        let sent_at = claims
            .get("timestamp")
            .ok_or(AuthError::Missing("token timestamp"))
            .and_then(|t| {
                ProviderTime::from_json(t).map_err(|_| AuthError::Malformed("token timestamp"))
            })?
            .as_datetime();
        check_tolerance(sent_at, now, self.tolerance)?;
        let delivery_id = header(headers, ID_HEADER).map(str::to_owned);
        Ok(parse_claims(claims, delivery_id, sent_at))
    }
}

/// Reads verified claims. The dedupe key is the signed `event_id` claim; the `webhook-id`
/// header lies outside the signature (anyone holding a captured token could send it under
/// new ids), so it is the key only for a token that names no event id (docs/design.md §6).
pub fn parse_claims(
    claims: Value,
    delivery_id: Option<String>,
    sent_at: DateTime<Utc>,
) -> VerifiedEvent {
    let content_hash = content_hash(&claims);
    let key = str_at(&claims, "/event_id")
        .and_then(|id| DedupeKey::parse(id).ok())
        .or_else(|| {
            delivery_id
                .as_deref()
                .and_then(|id| DedupeKey::parse(id).ok())
        });
    let (dedupe_key, meta) = match key {
        Some(key) => (key, meta(&claims)),
        None => (
            DedupeKey::from_body(&serde_json::to_vec(&claims).unwrap_or_default()),
            Err("the event has neither a webhook-id nor an event_id".to_owned()),
        ),
    };
    VerifiedEvent {
        dedupe_key,
        content_hash,
        payload: Some(claims),
        sent_at: Some(sent_at),
        delivery_id,
        meta,
        signed_with: None,
    }
}

pub fn content_hash(claims: &Value) -> ContentHash {
    ContentHash::of_json_without(claims, ENVELOPE_CLAIMS)
}

/// Where Kinde billing events name their customer: Kinde does not publish the `data` layout,
/// and both of these are read in the wild (docs/design.md §6).
pub const CUSTOMER_FIELDS: [&str; 2] = ["/data/customer_id", "/data/customer/id"];

fn meta(claims: &Value) -> Result<EventMeta, String> {
    let event_type = str_at(claims, "/type").ok_or("the event has no type")?;
    let time = claims
        .get("event_timestamp")
        .filter(|v| !v.is_null())
        .or_else(|| claims.get("timestamp"))
        .ok_or("the event has no event_timestamp")?;
    let occurred_at = ProviderTime::from_json(time).map_err(|e| e.to_string())?;
    let customer = CUSTOMER_FIELDS
        .iter()
        .find_map(|pointer| str_at(claims, pointer))
        .and_then(|c| CustomerId::parse(c).ok());
    Ok(EventMeta {
        event_type: event_type.to_owned(),
        customer,
        occurred_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::kinde::fixtures::token as kinde_token;
    use crate::providers::kinde::jwks::LOOKUP_BUDGET;
    use chrono::Duration as ChronoDuration;
    use hmac::{Hmac, Mac};
    use serde_json::json;
    use sha2::Sha256;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    const KEY_A: &[u8] = include_bytes!("../../../../testdata/kinde_test_key_a.pem");
    const KEY_B: &[u8] = include_bytes!("../../../../testdata/kinde_test_key_b.pem");
    const JWKS_A: &str = include_str!("../../../../testdata/jwks_a.json");
    const JWKS_ALL: &str = include_str!("../../../../testdata/jwks_all.json");
    const JWKS_WRONG_TYPE: &str = include_str!("../../../../testdata/jwks_wrong_type.json");

    fn claims(now: DateTime<Utc>) -> Value {
        json!({
            "type": "customer.plan_changed",
            "event_id": "event_1",
            "event_timestamp": (now - ChronoDuration::seconds(5)).to_rfc3339(),
            "timestamp": now.to_rfc3339(),
            "source": "api",
            "data": {"customer_id": "kc_1", "plan": {"key": "pro"}}
        })
    }

    async fn jwks_server(body: &str, expected_fetches: u64) -> MockServer {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/.well-known/jwks"))
            .respond_with(
                ResponseTemplate::new(200).set_body_raw(body.to_owned(), "application/json"),
            )
            .expect(expected_fetches)
            .mount(&server)
            .await;
        server
    }

    fn verifier_for(server: &MockServer, ttl: Duration) -> KindeVerifier {
        let url = url::Url::parse(&format!("{}/.well-known/jwks", server.uri())).unwrap();
        KindeVerifier::new(
            JwksCache::with_timing(url, reqwest::Client::new(), ttl, Duration::from_secs(30)),
            Duration::from_secs(300),
        )
    }

    fn webhook_headers(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(ID_HEADER, id.parse().unwrap());
        h
    }

    #[tokio::test]
    async fn valid_token_verifies_and_parses() {
        let server = jwks_server(JWKS_A, 1).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let token = kinde_token(KEY_A, "test-key-a", &claims(now)).unwrap();
        let event = v
            .check(&webhook_headers("wh_1"), token.as_bytes(), now)
            .await
            .unwrap();
        assert_eq!(
            event.dedupe_key.as_str(),
            "event_1",
            "the signed id is the key"
        );
        assert_eq!(event.delivery_id.as_deref(), Some("wh_1"));
        let meta = event.meta.unwrap();
        assert_eq!(meta.event_type, "customer.plan_changed");
        assert_eq!(meta.customer.unwrap().as_str(), "kc_1");
        // A second token is verified from the cache: the mock expects exactly one fetch.
        let again = kinde_token(KEY_A, "test-key-a", &claims(now)).unwrap();
        assert!(v
            .check(&HeaderMap::new(), again.as_bytes(), now)
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn a_captured_token_under_new_webhook_ids_is_one_event() {
        let server = jwks_server(JWKS_A, 1).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let token = kinde_token(KEY_A, "test-key-a", &claims(now)).unwrap();
        for id in ["wh_1", "wh_forged_2", "wh_future_3"] {
            let event = v
                .check(&webhook_headers(id), token.as_bytes(), now)
                .await
                .unwrap();
            assert_eq!(event.dedupe_key.as_str(), "event_1");
        }
    }

    #[tokio::test]
    async fn webhook_id_is_the_key_only_when_the_token_names_no_event() {
        let server = jwks_server(JWKS_A, 1).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let mut without_id = claims(now);
        without_id.as_object_mut().unwrap().remove("event_id");
        let token = kinde_token(KEY_A, "test-key-a", &without_id).unwrap();
        let event = v
            .check(&webhook_headers("wh_1"), token.as_bytes(), now)
            .await
            .unwrap();
        assert_eq!(event.dedupe_key.as_str(), "wh_1");
    }

    #[test]
    fn customer_is_read_from_either_layout() {
        let now = Utc::now();
        let mut nested = claims(now);
        nested["data"] = json!({"customer": {"id": "kc_2"}, "plan": {"code": "pro"}});
        let meta = parse_claims(nested, None, now).meta.unwrap();
        assert_eq!(meta.customer.unwrap().as_str(), "kc_2");
    }

    #[tokio::test]
    async fn tampered_token_is_rejected() {
        let server = jwks_server(JWKS_A, 1).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let token = kinde_token(KEY_A, "test-key-a", &claims(now)).unwrap();
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let mut forged = claims(now);
        forged["data"]["plan"]["key"] = json!("enterprise");
        parts[1] = BASE64URL.encode(serde_json::to_vec(&forged).unwrap());
        let tampered = parts.join(".");
        assert_eq!(refusal(&v, &tampered, now).await, AuthError::BadSignature);
    }

    #[tokio::test]
    async fn token_signed_by_another_key_under_a_known_kid_is_rejected() {
        let server = jwks_server(JWKS_A, 1).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let token = kinde_token(KEY_B, "test-key-a", &claims(now)).unwrap();
        assert_eq!(refusal(&v, &token, now).await, AuthError::BadSignature);
    }

    /// Why the verifier refuses a token delivered without a webhook-id header.
    async fn refusal(v: &KindeVerifier, token: &str, now: DateTime<Utc>) -> AuthError {
        v.check(&HeaderMap::new(), token.as_bytes(), now)
            .await
            .unwrap_err()
    }

    fn unsigned_token(alg: &str, claims: &Value, signature: &str) -> String {
        let header = BASE64URL.encode(format!(
            r#"{{"alg":"{alg}","typ":"JWT","kid":"test-key-a"}}"#
        ));
        let body = BASE64URL.encode(serde_json::to_vec(claims).unwrap());
        format!("{header}.{body}.{signature}")
    }

    #[tokio::test]
    async fn alg_none_is_rejected() {
        let server = jwks_server(JWKS_A, 0).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let token = unsigned_token("none", &claims(now), "");
        assert_eq!(
            refusal(&v, &token, now).await,
            AuthError::AlgorithmNotAllowed("none".into())
        );
    }

    #[tokio::test]
    async fn hs256_signed_with_the_public_key_is_rejected() {
        // The classic confusion attack: HMAC keyed with the RSA public key the verifier holds.
        let server = jwks_server(JWKS_A, 0).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let public_pem = include_bytes!("../../../../testdata/kinde_test_pub_a.pem");
        let unsigned = unsigned_token("HS256", &claims(now), "");
        let signing_input = unsigned.trim_end_matches('.');
        let mut mac = Hmac::<Sha256>::new_from_slice(public_pem).unwrap();
        mac.update(signing_input.as_bytes());
        let token = format!(
            "{signing_input}.{}",
            BASE64URL.encode(mac.finalize().into_bytes())
        );
        assert_eq!(
            refusal(&v, &token, now).await,
            AuthError::AlgorithmNotAllowed("HS256".into())
        );
    }

    #[tokio::test]
    async fn key_of_the_wrong_type_is_rejected() {
        let server = jwks_server(JWKS_WRONG_TYPE, 1).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let token = kinde_token(KEY_A, "test-key-a", &claims(now)).unwrap();
        assert_eq!(
            refusal(&v, &token, now).await,
            AuthError::WrongKeyType("test-key-a".into())
        );
    }

    #[tokio::test]
    async fn unknown_kid_refetches_once_and_finds_a_rotated_key() {
        let server = MockServer::start().await;
        // First the set holds key A only; after rotation it holds both.
        Mock::given(method("GET"))
            .and(path("/.well-known/jwks"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(JWKS_A, "application/json"))
            .up_to_n_times(1)
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/.well-known/jwks"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(JWKS_ALL, "application/json"))
            .expect(1)
            .mount(&server)
            .await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let a = kinde_token(KEY_A, "test-key-a", &claims(now)).unwrap();
        v.check(&HeaderMap::new(), a.as_bytes(), now).await.unwrap();
        let b = kinde_token(KEY_B, "test-key-b", &claims(now)).unwrap();
        v.check(&HeaderMap::new(), b.as_bytes(), now).await.unwrap();
    }

    #[tokio::test]
    async fn unknown_kid_refetch_is_rate_limited() {
        // One fetch at start, one refetch for the first unknown kid, none for the rest.
        let server = jwks_server(JWKS_A, 2).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        for i in 0..5 {
            let kid = format!("forged-{i}");
            let token = kinde_token(KEY_A, &kid, &claims(now)).unwrap();
            assert_eq!(refusal(&v, &token, now).await, AuthError::UnknownKey(kid));
        }
    }

    #[tokio::test]
    async fn expired_cache_is_refetched() {
        let server = jwks_server(JWKS_A, 2).await;
        let url = url::Url::parse(&format!("{}/.well-known/jwks", server.uri())).unwrap();
        let cache = JwksCache::with_timing(
            url,
            reqwest::Client::new(),
            Duration::from_secs(600),
            Duration::from_secs(30),
        );
        let start = Instant::now();
        cache.key("test-key-a", start).await.unwrap();
        cache
            .key("test-key-a", start + Duration::from_secs(599))
            .await
            .unwrap();
        cache
            .key("test-key-a", start + Duration::from_secs(601))
            .await
            .unwrap();
    }

    /// A slow JWKS host, and a refresh that finds the kid missing and fetches again: the
    /// lookup gives up within its budget (503, the provider retries) rather than taking the
    /// two fetches' time, which would outlast the intake's function timeout.
    #[tokio::test]
    async fn a_lookup_that_needs_two_slow_fetches_gives_up_within_its_budget() {
        let server = MockServer::start().await;
        let slow = |body: &str| {
            ResponseTemplate::new(200)
                .set_body_raw(body.to_owned(), "application/json")
                .set_delay(LOOKUP_BUDGET * 3 / 5)
        };
        Mock::given(method("GET"))
            .respond_with(slow(JWKS_A))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .respond_with(slow(JWKS_ALL))
            .mount(&server)
            .await;
        let url = url::Url::parse(&format!("{}/.well-known/jwks", server.uri())).unwrap();
        let cache = JwksCache::new(url, reqwest::Client::new());
        assert_eq!(
            cache.key("test-key-b", Instant::now()).await.unwrap_err(),
            AuthError::KeysUnavailable
        );
    }

    #[tokio::test]
    async fn unreachable_jwks_is_a_server_side_failure() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(500))
            .mount(&server)
            .await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        let token = kinde_token(KEY_A, "test-key-a", &claims(now)).unwrap();
        assert_eq!(refusal(&v, &token, now).await, AuthError::KeysUnavailable);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_jwks_outage_costs_one_fetch_per_backoff_and_answers_fast() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(503))
            .expect(1)
            .mount(&server)
            .await;
        let v = std::sync::Arc::new(verifier_for(&server, Duration::from_secs(600)));
        let now = Utc::now();
        let token = kinde_token(KEY_A, "test-key-a", &claims(now)).unwrap();
        for _wave in 0..2 {
            let requests: Vec<_> = (0..100)
                .map(|_| {
                    let (v, token) = (v.clone(), token.clone());
                    tokio::spawn(
                        async move { v.check(&HeaderMap::new(), token.as_bytes(), now).await },
                    )
                })
                .collect();
            for request in requests {
                assert_eq!(
                    request.await.unwrap().unwrap_err(),
                    AuthError::KeysUnavailable
                );
            }
        }
        // The mock's expectation (exactly one fetch) is checked when it drops, in a blocking
        // call on this task that cannot yield: with the task's cooperative budget spent (the
        // 200 joins above may spend it to the last unit, made certain here) its lock would
        // answer "not yet" forever. A yield hands the task a fresh budget first.
        let spend = tokio::sync::Semaphore::new(1);
        while tokio::task::coop::has_budget_remaining() {
            drop(spend.acquire().await);
        }
        tokio::task::yield_now().await;
    }

    #[tokio::test]
    async fn a_slow_refresh_does_not_hold_up_requests_with_cached_keys() {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(200).set_body_raw(JWKS_A, "application/json"))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_raw(JWKS_A, "application/json")
                    .set_delay(Duration::from_secs(3)),
            )
            .mount(&server)
            .await;
        let url = url::Url::parse(&format!("{}/.well-known/jwks", server.uri())).unwrap();
        let cache = std::sync::Arc::new(JwksCache::with_timing(
            url,
            reqwest::Client::new(),
            Duration::from_secs(600),
            Duration::from_secs(30),
        ));
        let start = Instant::now();
        cache.key("test-key-a", start).await.unwrap();
        // Expired: one request refreshes (slowly); another, meanwhile, is answered from the
        // cached keys without waiting on it.
        let later = start + Duration::from_secs(601);
        let refresher = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.key("test-key-a", later).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let answered = tokio::time::timeout(Duration::from_secs(1), cache.key("test-key-a", later))
            .await
            .expect("answered while the refresh is in flight");
        assert!(answered.is_ok());
        assert!(refresher.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn stale_and_future_tokens_are_rejected() {
        let server = jwks_server(JWKS_A, 1).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        let now = Utc::now();
        for (offset, expected) in [(-301, AuthError::Stale(300)), (301, AuthError::Future(300))] {
            let mut c = claims(now);
            c["timestamp"] = json!((now + ChronoDuration::seconds(offset)).to_rfc3339());
            let token = kinde_token(KEY_A, "test-key-a", &c).unwrap();
            assert_eq!(refusal(&v, &token, now).await, expected);
        }
    }

    #[tokio::test]
    async fn garbage_body_is_malformed() {
        let server = jwks_server(JWKS_A, 0).await;
        let v = verifier_for(&server, Duration::from_secs(600));
        for body in [&b"{}"[..], b"a.b.c", b"\xff\xfe"] {
            assert!(matches!(
                v.check(&HeaderMap::new(), body, Utc::now())
                    .await
                    .unwrap_err(),
                AuthError::Malformed(_)
            ));
        }
    }

    #[test]
    fn re_signed_retry_has_the_same_content_hash() {
        let now = Utc::now();
        let first = claims(now);
        let mut retry = first.clone();
        retry["timestamp"] = json!((now + ChronoDuration::seconds(60)).to_rfc3339());
        assert_eq!(content_hash(&first), content_hash(&retry));
        retry["data"]["plan"]["key"] = json!("free");
        assert_ne!(content_hash(&first), content_hash(&retry));
    }
}
