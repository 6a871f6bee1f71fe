//! Paddle Billing: `Paddle-Signature: ts=…;h1=…` over `"{ts}:{body}"` (any `h1` against any
//! secret), the event's `event_id` as the dedupe key, `occurred_at` as the provider time,
//! the per-destination `notification_id` kept as the delivery id (docs/design.md §6.4).

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::HeaderMap;
use serde_json::Value;

use crate::domain::{ContentHash, DedupeKey, EventMeta, ProviderTime, VerifiedEvent};
use crate::providers::common::{customer_at, str_at};
use crate::providers::CheckNow;
use crate::signing::timestamped::{self, Scheme};
use crate::signing::AuthError;

pub const SIGNATURE_HEADER: &str = "paddle-signature";

/// Paddle-Signature: `ts=…;h1=…` over `"{ts}:{body}"` (`signing::timestamped`), one `h1` per
/// active secret while a destination's secret rotates; other schemes (`h2`, as the SDK's tests
/// send) are skipped.
const SCHEME: Scheme = Scheme {
    header: SIGNATURE_HEADER,
    shown: "Paddle-Signature",
    separator: ';',
    time_key: "ts",
    signature_key: "h1",
    joiner: b":",
    bad_time: "Paddle-Signature timestamp",
    no_time: "Paddle-Signature: no ts=",
    no_signature: "Paddle-Signature: no h1 signature",
};

pub struct PaddleVerifier {
    secrets: Vec<Vec<u8>>,
    tolerance: Duration,
}

impl PaddleVerifier {
    pub fn new(secrets: Vec<Vec<u8>>, tolerance: Duration) -> Self {
        Self { secrets, tolerance }
    }
}

impl CheckNow for PaddleVerifier {
    /// Checks the time, then the signature (so a stale or forged header costs no HMAC over
    /// the body), then reads the event.
    fn check(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedEvent, AuthError> {
        let (sent_at, secret) =
            timestamped::check(&SCHEME, &self.secrets, self.tolerance, (headers, body), now)?;
        let mut event = parse_event(body, sent_at);
        event.signed_with = Some(secret);
        Ok(event)
    }
}

/// Reads a verified body. Anything that is not a Paddle event is still a verified event,
/// keyed by its bytes, with the reason it cannot be applied.
pub fn parse_event(body: &[u8], sent_at: DateTime<Utc>) -> VerifiedEvent {
    let payload: Option<Value> = serde_json::from_slice(body).ok();
    let dedupe_key = payload
        .as_ref()
        .and_then(|p| str_at(p, "/event_id"))
        .and_then(|id| DedupeKey::parse(id).ok());
    let delivery_id = payload
        .as_ref()
        .and_then(|p| str_at(p, "/notification_id"))
        .map(str::to_owned);
    let (dedupe_key, content_hash, meta) = match (&payload, dedupe_key) {
        (Some(p), Some(key)) => (key, content_hash(p), meta(p)),
        (Some(p), None) => (
            DedupeKey::from_body(body),
            content_hash(p),
            Err("the event has no event_id".to_owned()),
        ),
        (None, _) => (
            DedupeKey::from_body(body),
            ContentHash::of_bytes(body),
            Err("the body is not JSON".to_owned()),
        ),
    };
    VerifiedEvent {
        dedupe_key,
        content_hash,
        payload,
        sent_at: Some(sent_at),
        delivery_id,
        meta,
        signed_with: None,
    }
}

/// Fields of a Paddle notification that describe the delivery, not the event: each
/// destination (and each replay) gets a notification id of its own for the same event.
const ENVELOPE_FIELDS: &[&str] = &["notification_id"];

/// The hash of the event without the fields that vary by delivery.
pub fn content_hash(payload: &Value) -> ContentHash {
    ContentHash::of_json_without(payload, ENVELOPE_FIELDS)
}

/// The type, the customer (`data.customer_id`, a `ctm_…`; never `custom_data`) and the
/// provider time (`occurred_at`, RFC 3339).
fn meta(payload: &Value) -> Result<EventMeta, String> {
    let event_type = str_at(payload, "/event_type").ok_or("the event has no event_type")?;
    let occurred_at = payload
        .get("occurred_at")
        .ok_or("the event has no occurred_at")?;
    let occurred_at = ProviderTime::from_json(occurred_at).map_err(|e| e.to_string())?;
    // A `customer.*` event's object is the customer itself.
    let customer = if event_type.starts_with("customer.") {
        customer_at(payload, "/data/id")
    } else {
        customer_at(payload, "/data/customer_id")
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
    use crate::providers::paddle::fixtures::signature;
    use chrono::TimeZone;

    /// The Paddle Node SDK's validator tests (`src/__tests__/notifications/
    /// webhooks-validator.node.test.ts`): signed with `VALID_SECRET` at 2023-11-01T00:00:00Z.
    const SDK_TS: i64 = 1_698_796_800;
    const SDK_BODY: &str = r#"{"data": ["1", "2"]}"#;
    const SDK_HEADER: &str =
        "ts=1698796800;h1=a300428748dce5c70e4da19bffd60769591ea969c99dea3105d0ec9612cf43f9";
    const SDK_ROTATED_BODY: &str = r#"{"data": "value"}"#;
    const SDK_ROTATED_HEADER: &str = "ts=1698796800;h1=28981e941fae76e53db32f3d2a83cb69db41476595e84e1970a1b5d98f62b261;h1=28981e941fae76e53db32f3d2a83cb69db41476595e84e1970a1b5d98f62b261;h2=RANDOM_HASH";

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).unwrap()
    }

    fn verifier(secrets: &[&str]) -> PaddleVerifier {
        PaddleVerifier::new(
            secrets.iter().map(|s| s.as_bytes().to_vec()).collect(),
            Duration::from_secs(300),
        )
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, value.parse().unwrap());
        h
    }

    fn corpus(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../testdata/providers/paddle/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(path).unwrap()
    }

    #[test]
    fn the_sdks_vectors_verify_and_its_refusals_are_refused() {
        let v = verifier(&["VALID_SECRET"]);
        let event = v
            .check(&headers(SDK_HEADER), SDK_BODY.as_bytes(), at(SDK_TS + 1))
            .unwrap();
        assert_eq!(event.signed_with, Some(0));
        assert_eq!(event.meta.unwrap_err(), "the event has no event_id");
        // Several h1 (and an h2, skipped): one matches.
        v.check(
            &headers(SDK_ROTATED_HEADER),
            SDK_ROTATED_BODY.as_bytes(),
            at(SDK_TS),
        )
        .unwrap();
        // Our signer agrees with the SDK's.
        assert_eq!(
            signature(b"VALID_SECRET", SDK_TS, SDK_BODY.as_bytes()),
            SDK_HEADER
        );
        // The SDK's refusals: another secret, a body with more spaces, a stale timestamp.
        let other = verifier(&["INVALID_VALID_SECRET"]);
        assert_eq!(
            other
                .check(&headers(SDK_HEADER), SDK_BODY.as_bytes(), at(SDK_TS))
                .unwrap_err(),
            AuthError::BadSignature
        );
        assert_eq!(
            v.check(
                &headers(SDK_HEADER),
                br#"{ "data": [ "1", "2" ]}"#,
                at(SDK_TS)
            )
            .unwrap_err(),
            AuthError::BadSignature
        );
        assert_eq!(
            v.check(
                &headers(SDK_HEADER),
                SDK_BODY.as_bytes(),
                at(SDK_TS + 4 * 86_400)
            )
            .unwrap_err(),
            AuthError::Stale(300)
        );
    }

    #[test]
    fn a_rotated_secret_is_named_by_its_index() {
        let body = corpus("subscription.created");
        let header = signature(b"pdl_ntfset_new", SDK_TS, &body);
        let event = verifier(&["pdl_ntfset_old", "pdl_ntfset_new"])
            .check(&headers(&header), &body, at(SDK_TS))
            .unwrap();
        assert_eq!(event.signed_with, Some(1));
        // Both signatures during the rotation, the old secret alone configured.
        let both = format!(
            "{header};h1={}",
            signature(b"pdl_ntfset_old", SDK_TS, &body)
                .split_once(";h1=")
                .unwrap()
                .1
        );
        let event = verifier(&["pdl_ntfset_old"])
            .check(&headers(&both), &body, at(SDK_TS))
            .unwrap();
        assert_eq!(event.signed_with, Some(0));
    }

    #[test]
    fn stale_future_tampered_and_malformed_are_refused() {
        let body = corpus("subscription.created");
        let v = verifier(&["pdl_ntfset_a"]);
        let good = signature(b"pdl_ntfset_a", SDK_TS, &body);
        assert!(matches!(
            v.check(&headers(&good), &body, at(SDK_TS + 301)),
            Err(AuthError::Stale(300))
        ));
        assert!(matches!(
            v.check(&headers(&good), &body, at(SDK_TS - 301)),
            Err(AuthError::Future(300))
        ));
        let mut tampered = body.clone();
        let n = tampered.len() - 3;
        tampered[n] ^= 1;
        assert_eq!(
            v.check(&headers(&good), &tampered, at(SDK_TS)).unwrap_err(),
            AuthError::BadSignature
        );
        // Signed over `ts.body` (Stripe's form) is not Paddle's `ts:body`.
        let dotted = crate::providers::stripe::fixtures::signature(b"pdl_ntfset_a", SDK_TS, &body)
            .replace("t=", "ts=")
            .replace(",v1=", ";h1=");
        assert_eq!(
            v.check(&headers(&dotted), &body, at(SDK_TS)).unwrap_err(),
            AuthError::BadSignature
        );
        // The SDK's malformed headers, and a few more.
        for raw in [
            "invalid_header",
            "h1=invalid_header",
            "ts=1234;h2=invalid_header",
            "ts=abc;h1=00",
            "ts=1698796800;h1=",
            "ts=1698796800;h1=zz",
        ] {
            assert!(
                matches!(
                    v.check(&headers(raw), &body, at(SDK_TS)),
                    Err(AuthError::Malformed(_))
                ),
                "{raw}"
            );
        }
        assert_eq!(
            v.check(&HeaderMap::new(), &body, at(SDK_TS)).unwrap_err(),
            AuthError::Missing("Paddle-Signature")
        );
    }

    #[test]
    fn work_is_bounded_before_any_mac() {
        use crate::signing::tests::macs_of;
        let v = verifier(&["pdl_ntfset_a", "pdl_ntfset_b"]);
        let big = vec![b'x'; 1 << 20];
        let one = format!("ts={SDK_TS};h1={}", "ab".repeat(32));
        let (single, result) = macs_of(|| v.check(&headers(&one), &big, at(SDK_TS)));
        assert_eq!((single, result.unwrap_err()), (2, AuthError::BadSignature));
        let many = format!(
            "ts={SDK_TS};{}",
            format!("h1={};", "ab".repeat(32)).repeat(1000)
        );
        let (flood, result) = macs_of(|| v.check(&headers(&many), &big, at(SDK_TS)));
        assert!(matches!(result, Err(AuthError::TooManySignatures(..))));
        assert_eq!(flood, 0);
        let stale = format!("ts=1;h1={}", "ab".repeat(32));
        let (macs, result) = macs_of(|| v.check(&headers(&stale), &big, at(SDK_TS)));
        assert!(matches!(result, Err(AuthError::Stale(_))));
        assert_eq!(macs, 0);
    }

    #[test]
    fn the_event_id_is_the_key_and_the_notification_id_the_delivery() {
        let body = corpus("subscription.created");
        let event = parse_event(&body, at(SDK_TS));
        assert_eq!(event.dedupe_key.as_str(), "evt_01h7ht60jy5hpdv5x8tfsaxje4");
        assert_eq!(
            event.delivery_id.as_deref(),
            Some("ntf_01h7ht60n4grsa2a5ddd54h1j0")
        );
        let meta = event.meta.unwrap();
        assert_eq!(meta.event_type, "subscription.created");
        assert_eq!(
            meta.customer.unwrap().as_str(),
            "ctm_01h7hswb86rtps5ggbq7ybydcw"
        );
        assert_eq!(
            meta.occurred_at,
            ProviderTime::parse_rfc3339("2023-08-11T08:07:38.334150Z").unwrap()
        );
        // The same event to another destination: another notification id, the same content.
        let mut payload: Value = serde_json::from_slice(&body).unwrap();
        let first = content_hash(&payload);
        payload["notification_id"] = "ntf_other".into();
        assert_eq!(content_hash(&payload), first);
    }

    #[test]
    fn custom_data_never_names_the_customer() {
        let mut payload: Value = serde_json::from_slice(&corpus("transaction.paid")).unwrap();
        payload["data"]["custom_data"] = serde_json::json!({"customer_id": "ctm_forged"});
        let meta = meta(&payload).unwrap();
        assert_eq!(
            meta.customer.unwrap().as_str(),
            "ctm_01gxwxe6vzgz6hcsbwjs6zrszr"
        );
    }
}
