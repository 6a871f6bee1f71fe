//! Lemon Squeezy's deliveries: `X-Signature`, the hex HMAC-SHA256 of the raw body with the
//! webhook's signing secret (any configured secret, during a rotation), then the body read —
//! the dedupe key made of what is signed and stable, `data.attributes.updated_at` as the
//! provider time, `data.attributes.customer_id` as the customer (docs/design.md §6.5).

use chrono::{DateTime, Utc};
use http::HeaderMap;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::domain::{ContentHash, CustomerId, DedupeKey, EventMeta, ProviderTime, VerifiedEvent};
use crate::providers::common::str_at;
use crate::providers::CheckNow;
use crate::signing::{candidates, header, signing_key, AuthError};

pub const SIGNATURE_HEADER: &str = "x-signature";

/// The length of a hex HMAC-SHA256: a header of any other length is refused unread.
const SIGNATURE_HEX_LEN: usize = 64;

/// Fields of a body that a rendering of the same notification may change: the customer-facing
/// URLs are pre-signed and expire (Lemon Squeezy: "valid for 24 hours from time of request"),
/// so they are left out of the key's digest and of the content hash.
const VOLATILE: &[&str] = &["urls"];

/// Lemon Squeezy's deliveries, checked against every configured signing secret.
pub struct LemonSqueezyVerifier {
    secrets: Vec<Vec<u8>>,
}

impl LemonSqueezyVerifier {
    pub fn new(secrets: Vec<Vec<u8>>) -> Self {
        Self { secrets }
    }
}

impl CheckNow for LemonSqueezyVerifier {
    /// Checks the signature, then reads the event. Lemon Squeezy signs no time: there is no
    /// tolerance to check, and a replay of a signed body is a copy of its event (its key).
    fn check(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedEvent, AuthError> {
        let raw = header(headers, SIGNATURE_HEADER).ok_or(AuthError::Missing("X-Signature"))?;
        let raw = raw.trim();
        if raw.len() != SIGNATURE_HEX_LEN {
            return Err(AuthError::Malformed("X-Signature"));
        }
        let signature = candidates(std::iter::once(hex::decode(raw).ok()), "X-Signature")?;
        let message: [&[u8]; 1] = [body];
        let secret =
            signing_key(&self.secrets, &signature, &message).ok_or(AuthError::BadSignature)?;
        let mut event = parse_event(body, now);
        event.signed_with = Some(secret);
        Ok(event)
    }
}

/// Reads a verified body. A body that is not a Lemon Squeezy event is still a verified
/// event, keyed by its bytes, with the reason it cannot be applied.
pub fn parse_event(body: &[u8], received_at: DateTime<Utc>) -> VerifiedEvent {
    let payload: Option<Value> = serde_json::from_slice(body).ok();
    let (dedupe_key, content_hash, meta) = match &payload {
        Some(p) => match dedupe_key(p) {
            Ok(key) => (key, content_hash(p), meta(p)),
            Err(why) => (DedupeKey::from_body(body), content_hash(p), Err(why)),
        },
        None => (
            DedupeKey::from_body(body),
            ContentHash::of_bytes(body),
            Err("the body is not JSON".to_owned()),
        ),
    };
    VerifiedEvent {
        dedupe_key,
        content_hash,
        payload,
        sent_at: Some(received_at),
        delivery_id: None,
        meta,
        signed_with: None,
    }
}

/// The body without what a rendering may change (`data.attributes.urls`).
fn stable(payload: &Value) -> Value {
    let mut stable = payload.clone();
    if let Some(attributes) = stable
        .pointer_mut("/data/attributes")
        .and_then(Value::as_object_mut)
    {
        for field in VOLATILE {
            attributes.remove(*field);
        }
    }
    stable
}

/// The hash that tells a copy from a conflict: the stable body's.
pub fn content_hash(payload: &Value) -> ContentHash {
    ContentHash::of_json(&stable(payload))
}

/// Lemon Squeezy's payloads carry no event id (docs/design.md §6.5). The key is what the
/// notification signs and a retry repeats: `{event_name}:{data.type}:{data.id}:{updated_at}`
/// and the first 16 bytes (hex) of the SHA-256 of the stable body in canonical form. A retry
/// of one notification is a copy; two changes of one object are two events, even in one
/// second (their bodies differ); the `subscription_updated` Lemon Squeezy sends beside each
/// other subscription event is an event of its own (its name differs).
pub fn dedupe_key(payload: &Value) -> Result<DedupeKey, String> {
    let event_name =
        str_at(payload, "/meta/event_name").ok_or("the event has no meta.event_name")?;
    let object_type = str_at(payload, "/data/type").ok_or("the event has no data.type")?;
    let id = str_at(payload, "/data/id").ok_or("the event has no data.id")?;
    let updated_at = str_at(payload, "/data/attributes/updated_at").unwrap_or("-");
    let digest = Sha256::digest(ContentHash::of_json(&stable(payload)).as_bytes());
    DedupeKey::parse(&format!(
        "{event_name}:{object_type}:{id}:{updated_at}:{}",
        hex::encode(&digest[..16])
    ))
    .map_err(|e| e.to_string())
}

/// The customer an object names: `data.attributes.customer_id`, a number in Lemon Squeezy's
/// objects (a string accepted too). `meta.custom_data` is the checkout's, never an identity.
pub(super) fn customer(payload: &Value) -> Option<CustomerId> {
    match payload.pointer("/data/attributes/customer_id")? {
        Value::Number(n) => CustomerId::parse(&n.to_string()).ok(),
        Value::String(s) => CustomerId::parse(s).ok(),
        _ => None,
    }
}

/// The event's type, customer and provider time: the object's `updated_at` (else its
/// `created_at`), which orders the changes of one object.
fn meta(payload: &Value) -> Result<EventMeta, String> {
    let event_type =
        str_at(payload, "/meta/event_name").ok_or("the event has no meta.event_name")?;
    let at = ["/data/attributes/updated_at", "/data/attributes/created_at"]
        .iter()
        .filter_map(|p| payload.pointer(p))
        .find(|v| !v.is_null())
        .ok_or("the object has no updated_at")?;
    let occurred_at = ProviderTime::from_json(at).map_err(|e| e.to_string())?;
    Ok(EventMeta {
        event_type: event_type.to_owned(),
        customer: customer(payload),
        occurred_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::fixtures::hmac_sha256;
    use serde_json::json;

    fn headers(signature: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, signature.parse().unwrap());
        h.insert("x-event-name", "subscription_updated".parse().unwrap());
        h
    }

    fn sign(secret: &[u8], body: &[u8]) -> String {
        hex::encode(hmac_sha256(secret, body))
    }

    fn corpus(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../testdata/providers/lemonsqueezy/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(path).unwrap()
    }

    fn verifier(secrets: &[&str]) -> LemonSqueezyVerifier {
        LemonSqueezyVerifier::new(secrets.iter().map(|s| s.as_bytes().to_vec()).collect())
    }

    #[test]
    fn a_delivery_signed_with_the_secret_is_read() {
        let body = corpus("subscription_created");
        let event = verifier(&["s3cret"])
            .check(&headers(&sign(b"s3cret", &body)), &body, Utc::now())
            .unwrap();
        assert_eq!(event.signed_with, Some(0));
        let meta = event.meta.unwrap();
        assert_eq!(meta.event_type, "subscription_created");
        assert_eq!(meta.customer.unwrap().as_str(), "1");
        assert!(event
            .dedupe_key
            .as_str()
            .starts_with("subscription_created:subscriptions:1:"));
    }

    #[test]
    fn any_configured_secret_verifies_during_a_rotation() {
        let body = corpus("subscription_created");
        let v = verifier(&["old-secret", "new-secret"]);
        for (n, secret) in ["old-secret", "new-secret"].iter().enumerate() {
            let event = v
                .check(&headers(&sign(secret.as_bytes(), &body)), &body, Utc::now())
                .unwrap();
            assert_eq!(event.signed_with, Some(n), "the index names the secret");
        }
        // Uppercase hex is the same signature.
        let upper = sign(b"new-secret", &body).to_uppercase();
        assert!(v.check(&headers(&upper), &body, Utc::now()).is_ok());
    }

    #[test]
    fn a_tampered_or_foreign_delivery_is_refused() {
        let body = corpus("subscription_created");
        let v = verifier(&["s3cret"]);
        let signature = sign(b"s3cret", &body);
        let mut tampered = body.clone();
        let at = tampered.iter().position(|b| *b == b'7').unwrap();
        tampered[at] = b'8';
        assert_eq!(
            v.check(&headers(&signature), &tampered, Utc::now())
                .unwrap_err(),
            AuthError::BadSignature
        );
        assert_eq!(
            v.check(&headers(&sign(b"other", &body)), &body, Utc::now())
                .unwrap_err(),
            AuthError::BadSignature
        );
    }

    #[test]
    fn a_missing_or_malformed_signature_is_refused_unread() {
        let body = corpus("subscription_created");
        let v = verifier(&["s3cret"]);
        assert_eq!(
            v.check(&HeaderMap::new(), &body, Utc::now()).unwrap_err(),
            AuthError::Missing("X-Signature")
        );
        let good = sign(b"s3cret", &body);
        for bad in [
            "zz".repeat(32),
            good[..62].to_owned(),
            format!("{good}{good}"),
            format!("sha256={good}"),
            "a".repeat(10_000),
        ] {
            assert_eq!(
                v.check(&headers(&bad), &body, Utc::now()).unwrap_err(),
                AuthError::Malformed("X-Signature"),
                "{bad:.80}"
            );
        }
    }

    #[test]
    fn a_retry_is_a_copy_and_two_changes_are_two_events() {
        let first: Value = serde_json::from_slice(&corpus("subscription_updated")).unwrap();
        // A retry, rendered again: the pre-signed URLs differ, the rest is the same.
        let mut retry = first.clone();
        retry["data"]["attributes"]["urls"]["customer_portal"] =
            json!("https://my-store.lemonsqueezy.com/billing?expires=1&signature=00");
        assert_eq!(dedupe_key(&first), dedupe_key(&retry));
        assert_eq!(content_hash(&first), content_hash(&retry));
        // Another change of the same object in the same second: another event.
        let mut other = first.clone();
        other["data"]["attributes"]["status"] = json!("active");
        assert_ne!(dedupe_key(&first), dedupe_key(&other));
        // A later change: another event.
        let mut later = first.clone();
        later["data"]["attributes"]["updated_at"] = json!("2025-12-20T10:00:00.000000Z");
        assert_ne!(dedupe_key(&first), dedupe_key(&later));
        // The same state under another event name (Lemon Squeezy sends subscription_updated
        // beside each other subscription event): an event of its own.
        let mut renamed = first.clone();
        renamed["meta"]["event_name"] = json!("subscription_resumed");
        assert_ne!(dedupe_key(&first), dedupe_key(&renamed));
        assert!(dedupe_key(&first).unwrap().as_str().len() <= 255);
    }

    #[test]
    fn custom_data_never_names_the_customer() {
        let mut p: Value = serde_json::from_slice(&corpus("subscription_created")).unwrap();
        p["meta"]["custom_data"] = json!({"customer_id": "someone_else", "user_id": "u_9"});
        assert_eq!(meta(&p).unwrap().customer.unwrap().as_str(), "1");
        p["data"]["attributes"]
            .as_object_mut()
            .unwrap()
            .remove("customer_id");
        assert_eq!(meta(&p).unwrap().customer, None);
    }

    #[test]
    fn a_body_without_its_envelope_is_kept_unprocessable() {
        let body = br#"{"data": {"id": "1"}}"#;
        let event = parse_event(body, Utc::now());
        assert_eq!(event.dedupe_key, DedupeKey::from_body(body));
        assert_eq!(event.meta.unwrap_err(), "the event has no meta.event_name");
        let event = parse_event(b"not json", Utc::now());
        assert_eq!(event.meta.unwrap_err(), "the body is not JSON");
    }
}
