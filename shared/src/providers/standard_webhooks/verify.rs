//! Standard Webhooks (Polar, Svix-style senders): `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64> …` over `"{id}.{timestamp}.{body}"`.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use chrono::{DateTime, TimeZone, Utc};
use http::HeaderMap;
use serde_json::Value;

use crate::config::SecretEncoding;
use crate::domain::{ContentHash, DedupeKey, EventMeta, ProviderTime, VerifiedEvent};
use crate::providers::common::{
    candidates, check_tolerance, customer_at, header, signing_key, str_at,
};
use crate::providers::{AuthError, CheckNow};

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// The HMAC key a configured secret stands for. Standard Webhooks secrets are
/// `whsec_<base64>`; Polar signs with the secret string's own bytes.
pub fn decode_secret(secret: &str, encoding: SecretEncoding) -> Result<Vec<u8>, String> {
    match encoding {
        SecretEncoding::Raw => Ok(secret.as_bytes().to_vec()),
        SecretEncoding::Base64 => {
            let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
            let key = BASE64
                .decode(encoded)
                .map_err(|_| "not valid base64 (use \"secret_encoding\": \"raw\" for Polar)")?;
            if key.is_empty() {
                return Err("decodes to an empty key".into());
            }
            Ok(key)
        }
    }
}

pub struct StandardVerifier {
    keys: Vec<Vec<u8>>,
    tolerance: Duration,
}

/// The header under its Standard Webhooks name, or the `svix-` name older senders use.
fn either<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    header(headers, name).or_else(|| {
        let svix = name.replacen("webhook-", "svix-", 1);
        header(headers, &svix)
    })
}

impl StandardVerifier {
    pub fn new(keys: Vec<Vec<u8>>, tolerance: Duration) -> Self {
        Self { keys, tolerance }
    }
}

impl CheckNow for StandardVerifier {
    /// Checks the time, then the signature (so a stale or forged header costs no HMAC over
    /// the body), then reads the event.
    fn check(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedEvent, AuthError> {
        let id = either(headers, ID_HEADER).ok_or(AuthError::Missing("webhook-id"))?;
        let timestamp =
            either(headers, TIMESTAMP_HEADER).ok_or(AuthError::Missing("webhook-timestamp"))?;
        let signatures =
            either(headers, SIGNATURE_HEADER).ok_or(AuthError::Missing("webhook-signature"))?;
        let sent_at = timestamp
            .parse::<i64>()
            .ok()
            .and_then(|seconds| Utc.timestamp_opt(seconds, 0).single())
            .ok_or(AuthError::Malformed("webhook-timestamp"))?;
        check_tolerance(sent_at, now, self.tolerance)?;
        let candidates = candidates(
            signatures
                .split_whitespace()
                .filter_map(|s| s.split_once(','))
                .filter(|(version, _)| *version == "v1")
                // A signature that is not base64 can never match; one beside it still may.
                .map(|(_, sig)| BASE64.decode(sig).ok()),
            "webhook-signature: no v1 signature",
        )?;
        let message: [&[u8]; 5] = [id.as_bytes(), b".", timestamp.as_bytes(), b".", body];
        // A signature of the wrong length (a bare `v1,`) never passes.
        let secret =
            signing_key(&self.keys, &candidates, &message).ok_or(AuthError::BadSignature)?;
        let mut event = parse_event(id, body, sent_at);
        event.signed_with = Some(secret);
        Ok(event)
    }
}

/// Reads a verified body; the message id is the dedupe key.
pub fn parse_event(id: &str, body: &[u8], sent_at: DateTime<Utc>) -> VerifiedEvent {
    let payload: Option<Value> = serde_json::from_slice(body).ok();
    let content_hash = payload
        .as_ref()
        .map(ContentHash::of_json)
        .unwrap_or_else(|| ContentHash::of_bytes(body));
    let meta = match &payload {
        Some(p) => meta(p, sent_at),
        None => Err("the body is not JSON".to_owned()),
    };
    let (dedupe_key, meta) = match DedupeKey::parse(id) {
        Ok(key) => (key, meta),
        Err(e) => (DedupeKey::from_body(body), Err(e.to_string())),
    };
    VerifiedEvent {
        dedupe_key,
        content_hash,
        payload,
        sent_at: Some(sent_at),
        delivery_id: Some(id.to_owned()),
        meta,
        signed_with: None,
    }
}

/// Provider time: the object's `modified_at`, else the envelope's `timestamp`, else the
/// signed send time (the latest the event can have happened).
fn meta(payload: &Value, sent_at: DateTime<Utc>) -> Result<EventMeta, String> {
    let event_type = str_at(payload, "/type").ok_or("the event has no type")?;
    let occurred_at = ["/data/modified_at", "/timestamp"]
        .iter()
        .filter_map(|p| payload.pointer(p))
        .find(|v| !v.is_null())
        .map(|v| ProviderTime::from_json(v).map_err(|e| e.to_string()))
        .unwrap_or(Ok(ProviderTime::from(sent_at)))?;
    // A `customer.*` event's object is the customer itself (Polar's `customer.deleted`).
    let customer = if event_type.starts_with("customer.") {
        customer_at(payload, "/data")
    } else {
        customer_at(payload, "/data/customer_id").or_else(|| customer_at(payload, "/data/customer"))
    };
    Ok(EventMeta {
        event_type: event_type.to_owned(),
        customer,
        occurred_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::standard_webhooks::fixtures::signature;
    use serde_json::json;

    #[test]
    fn a_customer_event_names_the_customer_at_data_id() {
        let p = json!({"type": "customer.deleted", "timestamp": "2026-01-01T00:00:00Z",
                       "data": {"id": "cust_9", "email": "a@example.com"}});
        let meta = meta(&p, Utc::now()).unwrap();
        assert_eq!(meta.customer.unwrap().as_str(), "cust_9");
    }

    const NOW: i64 = 1_767_225_600;

    fn now() -> DateTime<Utc> {
        Utc.timestamp_opt(NOW, 0).unwrap()
    }

    fn headers(id: &str, ts: i64, sig: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(ID_HEADER, id.parse().unwrap());
        h.insert(TIMESTAMP_HEADER, ts.to_string().parse().unwrap());
        h.insert(SIGNATURE_HEADER, sig.parse().unwrap());
        h
    }

    fn verifier(keys: &[&[u8]]) -> StandardVerifier {
        StandardVerifier::new(
            keys.iter().map(|k| k.to_vec()).collect(),
            Duration::from_secs(300),
        )
    }

    fn body() -> Vec<u8> {
        serde_json::to_vec(&json!({
            "type": "subscription.updated",
            "timestamp": "2025-12-31T23:59:00Z",
            "data": {"id": "sub_1", "customer_id": "cust_1", "status": "active",
                     "modified_at": "2025-12-31T23:58:00Z"}
        }))
        .unwrap()
    }

    #[test]
    fn work_is_bounded_before_any_mac() {
        use crate::providers::common::tests::macs_of;
        let v = verifier(&[b"key_a", b"key_b"]);
        let big = vec![b'x'; 1 << 20];
        let real = format!("v1,{}", BASE64.encode([1u8; 32]));
        let (single, result) = macs_of(|| v.check(&headers("msg_1", NOW, &real), &big, now()));
        assert_eq!((single, result.unwrap_err()), (2, AuthError::BadSignature));
        let empty = "v1, ".repeat(1000);
        let (flood, result) =
            macs_of(|| v.check(&headers("msg_1", NOW, empty.trim()), &big, now()));
        assert!(matches!(result, Err(AuthError::Malformed(_))));
        assert!(flood <= 2 * single, "{flood} MACs against {single}");
        let many = format!("{real} ").repeat(1000);
        let (flood, result) = macs_of(|| v.check(&headers("msg_1", NOW, many.trim()), &big, now()));
        assert!(matches!(result, Err(AuthError::TooManySignatures(..))));
        assert_eq!(flood, 0);
        let (macs, result) = macs_of(|| v.check(&headers("msg_1", 1, &real), &big, now()));
        assert!(matches!(result, Err(AuthError::Stale(_))));
        assert_eq!(macs, 0);
    }

    #[test]
    fn published_test_vector_verifies() {
        // The Standard Webhooks specification's reference vector.
        let key = decode_secret(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            SecretEncoding::Base64,
        )
        .unwrap();
        let v = StandardVerifier::new(vec![key], Duration::from_secs(300));
        let body = br#"{"test": 2432232314}"#;
        let h = headers(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        );
        let at = Utc.timestamp_opt(1_614_265_330, 0).unwrap();
        let event = v.check(&h, body, at).unwrap();
        assert_eq!(event.dedupe_key.as_str(), "msg_p5jXN8AQM9LWM0D4loKWxJek");
        assert_eq!(event.meta.unwrap_err(), "the event has no type");
    }

    #[test]
    fn polar_raw_secret_signs_with_its_own_bytes() {
        let key = decode_secret("polar_whs_x", SecretEncoding::Raw).unwrap();
        assert_eq!(key, b"polar_whs_x");
        // Computed with openssl: HMAC-SHA256 keyed with the bytes of "polar_whs_x".
        let h = headers(
            "msg_1",
            NOW,
            "v1,bYNWhctPhkCE5HMw0zFP3RQHB1wF0C14oI5C8Q5qR58=",
        );
        let v = StandardVerifier::new(vec![key], Duration::from_secs(300));
        assert!(v.check(&h, br#"{"type":"x"}"#, now()).is_ok());
    }

    #[test]
    fn base64_secret_must_decode() {
        assert!(decode_secret("whsec_!!!", SecretEncoding::Base64).is_err());
        assert!(decode_secret("whsec_", SecretEncoding::Base64).is_err());
    }

    #[test]
    fn valid_delivery_is_parsed_in_provider_time() {
        let b = body();
        let sig = signature(b"k", "msg_1", NOW, &b);
        let event = verifier(&[b"k"])
            .check(&headers("msg_1", NOW, &sig), &b, now())
            .unwrap();
        let meta = event.meta.unwrap();
        assert_eq!(meta.event_type, "subscription.updated");
        assert_eq!(meta.customer.unwrap().as_str(), "cust_1");
        assert_eq!(
            meta.occurred_at,
            ProviderTime::parse_rfc3339("2025-12-31T23:58:00Z").unwrap()
        );
        assert_eq!(event.delivery_id.as_deref(), Some("msg_1"));
    }

    #[test]
    fn envelope_timestamp_is_the_fallback_time() {
        let p = json!({"type": "order.paid", "timestamp": "2025-12-31T23:59:00Z",
                       "data": {"customer": {"id": "c"}, "modified_at": null}});
        let meta = meta(&p, now()).unwrap();
        assert_eq!(
            meta.occurred_at,
            ProviderTime::parse_rfc3339("2025-12-31T23:59:00Z").unwrap()
        );
        assert_eq!(meta.customer.unwrap().as_str(), "c");
        let bare = json!({"type": "order.paid", "data": {}});
        assert_eq!(meta_time(&bare), ProviderTime::from(now()));
    }

    fn meta_time(p: &Value) -> ProviderTime {
        meta(p, now()).unwrap().occurred_at
    }

    #[test]
    fn several_signatures_any_one_valid_passes() {
        let b = body();
        let good = signature(b"k", "msg_1", NOW, &b);
        let bad = signature(b"other", "msg_1", NOW, &b);
        let h = headers("msg_1", NOW, &format!("{bad} v2,abc {good}"));
        assert!(verifier(&[b"k"]).check(&h, &b, now()).is_ok());
    }

    #[test]
    fn bare_and_truncated_signatures_never_pass() {
        let b = body();
        let good = signature(b"k", "msg_1", NOW, &b);
        let truncated = &good[..good.len() - 8];
        for sig in ["v1,", "v1,AAAA", truncated, "v1,=", "v1"] {
            let result = verifier(&[b"k"]).check(&headers("msg_1", NOW, sig), &b, now());
            assert!(result.is_err(), "signature {sig:?} passed");
        }
    }

    #[test]
    fn tampered_body_wrong_key_and_wrong_id_are_rejected() {
        let b = body();
        let sig = signature(b"k", "msg_1", NOW, &b);
        let v = verifier(&[b"k"]);
        let mut tampered = b.clone();
        tampered[5] ^= 1;
        assert_eq!(
            v.check(&headers("msg_1", NOW, &sig), &tampered, now())
                .unwrap_err(),
            AuthError::BadSignature
        );
        assert_eq!(
            v.check(&headers("msg_2", NOW, &sig), &b, now())
                .unwrap_err(),
            AuthError::BadSignature
        );
        assert_eq!(
            verifier(&[b"x"])
                .check(&headers("msg_1", NOW, &sig), &b, now())
                .unwrap_err(),
            AuthError::BadSignature
        );
    }

    #[test]
    fn rotated_keys_both_verify() {
        let b = body();
        let sig = signature(b"old", "msg_1", NOW, &b);
        assert!(verifier(&[b"new", b"old"])
            .check(&headers("msg_1", NOW, &sig), &b, now())
            .is_ok());
    }

    #[test]
    fn stale_and_future_timestamps_are_rejected() {
        let b = body();
        let v = verifier(&[b"k"]);
        let stale = signature(b"k", "msg_1", NOW - 301, &b);
        assert_eq!(
            v.check(&headers("msg_1", NOW - 301, &stale), &b, now())
                .unwrap_err(),
            AuthError::Stale(300)
        );
        let future = signature(b"k", "msg_1", NOW + 301, &b);
        assert_eq!(
            v.check(&headers("msg_1", NOW + 301, &future), &b, now())
                .unwrap_err(),
            AuthError::Future(300)
        );
    }

    #[test]
    fn missing_headers_are_named() {
        let v = verifier(&[b"k"]);
        assert_eq!(
            v.check(&HeaderMap::new(), b"{}", now()).unwrap_err(),
            AuthError::Missing("webhook-id")
        );
    }

    #[test]
    fn svix_header_names_are_accepted() {
        let b = body();
        let sig = signature(b"k", "msg_1", NOW, &b);
        let mut h = HeaderMap::new();
        h.insert("svix-id", "msg_1".parse().unwrap());
        h.insert("svix-timestamp", NOW.to_string().parse().unwrap());
        h.insert("svix-signature", sig.parse().unwrap());
        assert!(verifier(&[b"k"]).check(&h, &b, now()).is_ok());
    }
}
