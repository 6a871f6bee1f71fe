//! Stripe: `Stripe-Signature: t=…,v1=…` over `"{t}.{body}"`, event `id` as the dedupe key.

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::HeaderMap;
use serde_json::Value;

use crate::domain::{ContentHash, CustomerId, DedupeKey, EventMeta, ProviderTime, VerifiedEvent};
use crate::providers::common::{customer_at, str_at};
use crate::providers::CheckNow;
use crate::signing::timestamped::{self, Scheme};
use crate::signing::AuthError;

pub const SIGNATURE_HEADER: &str = "stripe-signature";

/// Fields of a Stripe event that describe the delivery, not the event: they change between
/// attempts, and between a webhook and the same event read back from the API.
const ENVELOPE_FIELDS: &[&str] = &["pending_webhooks"];

/// Stripe-Signature: `t=…,v1=…` over `"{t}.{body}"` (`signing::timestamped`).
const SCHEME: Scheme = Scheme {
    header: SIGNATURE_HEADER,
    shown: "Stripe-Signature",
    separator: ',',
    time_key: "t",
    signature_key: "v1",
    joiner: b".",
    bad_time: "Stripe-Signature timestamp",
    no_time: "Stripe-Signature: no t=",
    no_signature: "Stripe-Signature: no v1 signature",
};

pub struct StripeVerifier {
    secrets: Vec<Vec<u8>>,
    tolerance: Duration,
}

impl StripeVerifier {
    pub fn new(secrets: Vec<Vec<u8>>, tolerance: Duration) -> Self {
        Self { secrets, tolerance }
    }
}

impl CheckNow for StripeVerifier {
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

/// Reads a verified body. Anything that is not a Stripe event is still a verified event,
/// keyed by its bytes, with the reason it cannot be applied.
pub fn parse_event(body: &[u8], sent_at: DateTime<Utc>) -> VerifiedEvent {
    let payload: Option<Value> = serde_json::from_slice(body).ok();
    let dedupe_key = payload
        .as_ref()
        .and_then(|p| str_at(p, "/id"))
        .and_then(|id| DedupeKey::parse(id).ok());
    let (dedupe_key, content_hash, meta) = match (&payload, dedupe_key) {
        (Some(p), Some(key)) => (key, content_hash(p), meta(p)),
        (Some(p), None) => (
            DedupeKey::from_body(body),
            content_hash(p),
            Err("the event has no id".to_owned()),
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
        delivery_id: None,
        meta,
        signed_with: None,
    }
}

/// The hash of the event without the fields that vary by delivery.
pub fn content_hash(payload: &Value) -> ContentHash {
    ContentHash::of_json_without(payload, ENVELOPE_FIELDS)
}

fn meta(payload: &Value) -> Result<EventMeta, String> {
    let event_type = str_at(payload, "/type").ok_or("the event has no type")?;
    let created = payload
        .get("created")
        .ok_or("the event has no created time")?;
    let occurred_at = ProviderTime::from_json(created).map_err(|e| e.to_string())?;
    Ok(EventMeta {
        event_type: event_type.to_owned(),
        customer: customer(payload),
        occurred_at,
    })
}

/// The customer an event is about: the object's customer, or the object itself when the
/// event is about a customer. An event from a Connect endpoint names the connected
/// `account`; its customers are that account's, so the account is part of the id:
/// `acct_…/cus_…` (docs/design.md §4.6a). The connected account is the event's and the
/// customer the object's, whichever ids they are: a customer that is an Account of a
/// connected account is `acct_…/acct_…`.
fn customer(payload: &Value) -> Option<CustomerId> {
    let object = payload.pointer("/data/object")?;
    let customer = if str_at(object, "/object") == Some("customer") {
        str_at(object, "/id").and_then(|id| CustomerId::parse(id).ok())
    } else {
        object_customer(object)
    }?;
    let connected = str_at(payload, "/account").filter(|a| !a.trim().is_empty());
    CustomerId::of_account(customer.as_str(), connected).ok()
}

/// The customer an object names (docs/design.md §6.2): its `customer` (a Customer, `cus_…`,
/// as an id or expanded), else its `customer_account` (an Account configured as a customer,
/// `acct_…`, which v1 objects name from 2025-12-15.clover on, with `customer` null when the
/// customer has no Customer object). An object naming both is one customer, and its Customer
/// id wins: it is the id every earlier event of that customer named, before its account named
/// an Account as well.
pub(crate) fn object_customer(object: &Value) -> Option<CustomerId> {
    customer_at(object, "/customer").or_else(|| customer_at(object, "/customer_account"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    use crate::providers::stripe::fixtures::{hmac_sha256_hex, signature};
    use serde_json::json;

    const NOW: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

    fn now() -> DateTime<Utc> {
        Utc.timestamp_opt(NOW, 0).unwrap()
    }

    fn verifier(secrets: &[&str]) -> StripeVerifier {
        StripeVerifier::new(
            secrets.iter().map(|s| s.as_bytes().to_vec()).collect(),
            Duration::from_secs(300),
        )
    }

    fn body() -> Vec<u8> {
        serde_json::to_vec(&json!({
            "id": "evt_1", "object": "event", "type": "invoice.paid", "created": NOW - 10,
            "pending_webhooks": 1,
            "data": {"object": {"id": "in_1", "object": "invoice", "customer": "cus_1"}}
        }))
        .unwrap()
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(SIGNATURE_HEADER, value.parse().unwrap());
        h
    }

    #[test]
    fn work_is_bounded_before_any_mac() {
        use crate::signing::tests::macs_of;
        let v = verifier(&["whsec_a", "whsec_b"]);
        let big = vec![b'x'; 1 << 20];
        // One real candidate: one MAC per secret.
        let one = format!("t={NOW},v1={}", "ab".repeat(32));
        let (single, result) = macs_of(|| v.check(&headers(&one), &big, now()));
        assert_eq!((single, result.unwrap_err()), (2, AuthError::BadSignature));
        // A thousand empty candidates: refused before any MAC.
        let empty = format!("t={NOW},{}", "v1=,".repeat(1000));
        let (flood, result) = macs_of(|| v.check(&headers(&empty), &big, now()));
        assert!(matches!(result, Err(AuthError::Malformed(_))));
        assert!(flood <= 2 * single, "{flood} MACs against {single}");
        // A thousand real-looking candidates: refused before any MAC.
        let many = format!(
            "t={NOW},{}",
            format!("v1={},", "ab".repeat(32)).repeat(1000)
        );
        let (flood, result) = macs_of(|| v.check(&headers(&many), &big, now()));
        assert!(matches!(result, Err(AuthError::TooManySignatures(..))));
        assert_eq!(flood, 0);
        // A stale timestamp: refused before any MAC.
        let stale = format!("t=1,v1={}", "ab".repeat(32));
        let (macs, result) = macs_of(|| v.check(&headers(&stale), &big, now()));
        assert!(matches!(result, Err(AuthError::Stale(_))));
        assert_eq!(macs, 0);
    }

    #[test]
    fn the_matching_secret_is_named_by_its_index() {
        let body = body();
        let header = signature(b"whsec_new", NOW, &body);
        let event = verifier(&["whsec_old", "whsec_new"])
            .check(&headers(&header), &body, now())
            .unwrap();
        assert_eq!(event.signed_with, Some(1));
    }

    #[test]
    fn known_vector_verifies() {
        // HMAC-SHA256 of "1767225600.{}" keyed with "whsec_test", computed with openssl.
        let header =
            format!("t={NOW},v1=4a942ef9477fb7b15b98664cf7ff2c2543984c1fa6bdf3520b48dcb25bcd1fe4");
        assert_eq!(signature(b"whsec_test", NOW, b"{}"), header);
        let event = verifier(&["whsec_test"])
            .check(&headers(&header), b"{}", now())
            .unwrap();
        assert!(
            event.meta.is_err(),
            "an empty object is verified but not parseable"
        );
    }

    #[test]
    fn valid_delivery_is_parsed() {
        let v = verifier(&["whsec_a"]);
        let b = body();
        let event = v
            .check(&headers(&signature(b"whsec_a", NOW, &b)), &b, now())
            .unwrap();
        assert_eq!(event.dedupe_key.as_str(), "evt_1");
        let meta = event.meta.unwrap();
        assert_eq!(meta.event_type, "invoice.paid");
        assert_eq!(meta.customer.unwrap().as_str(), "cus_1");
        assert_eq!(
            meta.occurred_at,
            ProviderTime::from_unix_secs(NOW - 10).unwrap()
        );
    }

    #[test]
    fn tampered_body_is_rejected() {
        let v = verifier(&["whsec_a"]);
        let b = body();
        let sig = signature(b"whsec_a", NOW, &b);
        let mut tampered = b.clone();
        tampered[10] ^= 1;
        assert_eq!(
            v.check(&headers(&sig), &tampered, now()).unwrap_err(),
            AuthError::BadSignature
        );
    }

    #[test]
    fn wrong_secret_is_rejected() {
        let v = verifier(&["whsec_a"]);
        let b = body();
        let sig = signature(b"whsec_other", NOW, &b);
        assert_eq!(
            v.check(&headers(&sig), &b, now()).unwrap_err(),
            AuthError::BadSignature
        );
    }

    #[test]
    fn any_v1_against_any_secret_passes_during_rotation() {
        let b = body();
        let old = hmac_sha256_hex(b"whsec_old", &[format!("{NOW}.").as_bytes(), &b].concat());
        let new = hmac_sha256_hex(b"whsec_new", &[format!("{NOW}.").as_bytes(), &b].concat());
        // The sender signs with both secrets; we only know the new one.
        let v = verifier(&["whsec_new"]);
        let header = format!("t={NOW},v1={old},v1={new}");
        assert!(v.check(&headers(&header), &b, now()).is_ok());
        // We know both; the sender only signs with the old one.
        let v = verifier(&["whsec_new", "whsec_old"]);
        assert!(v
            .check(&headers(&format!("t={NOW},v1={old}")), &b, now())
            .is_ok());
    }

    #[test]
    fn v0_is_ignored() {
        let b = body();
        let good = hmac_sha256_hex(b"whsec_a", &[format!("{NOW}.").as_bytes(), &b].concat());
        let v = verifier(&["whsec_a"]);
        assert_eq!(
            v.check(&headers(&format!("t={NOW},v0={good}")), &b, now())
                .unwrap_err(),
            AuthError::Malformed("Stripe-Signature: no v1 signature")
        );
    }

    #[test]
    fn truncated_and_empty_signatures_never_pass() {
        let b = body();
        let good = hmac_sha256_hex(b"whsec_a", &[format!("{NOW}.").as_bytes(), &b].concat());
        let v = verifier(&["whsec_a"]);
        for sig in [&good[..good.len() - 2], &good[..2], ""] {
            let result = v.check(&headers(&format!("t={NOW},v1={sig}")), &b, now());
            assert!(result.is_err(), "signature {sig:?} passed");
        }
    }

    #[test]
    fn stale_and_future_timestamps_are_rejected() {
        let v = verifier(&["whsec_a"]);
        let b = body();
        let stale = signature(b"whsec_a", NOW - 301, &b);
        assert_eq!(
            v.check(&headers(&stale), &b, now()).unwrap_err(),
            AuthError::Stale(300)
        );
        let future = signature(b"whsec_a", NOW + 301, &b);
        assert_eq!(
            v.check(&headers(&future), &b, now()).unwrap_err(),
            AuthError::Future(300)
        );
    }

    #[test]
    fn missing_or_garbled_header_is_rejected() {
        let v = verifier(&["whsec_a"]);
        assert_eq!(
            v.check(&HeaderMap::new(), b"{}", now()).unwrap_err(),
            AuthError::Missing("Stripe-Signature")
        );
        assert!(v.check(&headers("t=abc,v1=00"), b"{}", now()).is_err());
        assert!(v.check(&headers("v1=00"), b"{}", now()).is_err());
    }

    #[test]
    fn copy_with_new_send_time_has_the_same_content_hash() {
        let mut a: Value = serde_json::from_slice(&body()).unwrap();
        let first = content_hash(&a);
        a["pending_webhooks"] = json!(0);
        assert_eq!(first, content_hash(&a));
        a["data"]["object"]["customer"] = json!("cus_2");
        assert_ne!(first, content_hash(&a));
    }

    #[test]
    fn signed_non_json_is_kept_with_a_reason() {
        let v = verifier(&["whsec_a"]);
        let sig = signature(b"whsec_a", NOW, b"not json");
        let event = v.check(&headers(&sig), b"not json", now()).unwrap();
        assert!(event.dedupe_key.as_str().starts_with("sha256:"));
        assert_eq!(event.meta.unwrap_err(), "the body is not JSON");
    }

    #[test]
    fn customer_event_names_itself() {
        let p = json!({"id": "evt_2", "type": "customer.deleted", "created": NOW,
            "data": {"object": {"id": "cus_9", "object": "customer"}}});
        assert_eq!(meta(&p).unwrap().customer.unwrap().as_str(), "cus_9");
        let expanded = json!({"id": "evt_3", "type": "invoice.paid", "created": NOW,
            "data": {"object": {"object": "invoice", "customer": {"id": "cus_8"}}}});
        assert_eq!(meta(&expanded).unwrap().customer.unwrap().as_str(), "cus_8");
    }

    fn customer_of(object: Value, account: Option<&str>) -> Option<String> {
        let mut p = json!({"id": "evt_4", "type": "invoice.paid", "created": NOW,
            "data": {"object": object}});
        if let Some(account) = account {
            p["account"] = json!(account);
        }
        meta(&p).unwrap().customer.map(|c| c.as_str().to_owned())
    }

    /// docs/design.md §6.2: a customer that is an Account (Accounts v2) is named by
    /// `customer_account`, with `customer` null; that Account is the customer.
    #[test]
    fn a_customer_that_is_an_account_is_the_account_of_its_id() {
        for object in ["subscription", "invoice", "payment_intent", "refund"] {
            let named = json!({"id": "x_1", "object": object, "customer": null,
                "customer_account": "acct_1Cust"});
            assert_eq!(
                customer_of(named, None).as_deref(),
                Some("acct_1Cust"),
                "{object}"
            );
        }
        // An object of an API version before customer_account has only `customer`.
        let before = json!({"object": "invoice", "customer": "cus_1"});
        assert_eq!(customer_of(before, None).as_deref(), Some("cus_1"));
        // Neither: no customer.
        let neither = json!({"object": "charge", "customer": null});
        assert_eq!(customer_of(neither, None), None);
    }

    /// docs/design.md §6.2: an object naming both a Customer and an Account is one customer,
    /// keyed by its Customer id, the id its events named before its Account was named too.
    #[test]
    fn an_object_naming_both_ids_is_the_account_of_its_customer_id() {
        let before = json!({"object": "subscription", "customer": "cus_1Mig",
            "customer_account": null});
        let after = json!({"object": "subscription", "customer": "cus_1Mig",
            "customer_account": "acct_1Mig"});
        let expanded = json!({"object": "invoice", "customer": {"id": "cus_1Mig",
            "object": "customer", "customer_account": "acct_1Mig"},
            "customer_account": "acct_1Mig"});
        for object in [before, after, expanded] {
            assert_eq!(customer_of(object, None).as_deref(), Some("cus_1Mig"));
        }
        // An empty `customer` is no id: the Account is the customer.
        let empty = json!({"object": "invoice", "customer": "", "customer_account": "acct_1A"});
        assert_eq!(customer_of(empty, None).as_deref(), Some("acct_1A"));
    }

    /// docs/design.md §4.6a: the event's `account` is the connected account the event came
    /// from, the object's `customer_account` the customer; the key is `connected/customer`.
    #[test]
    fn a_connected_accounts_customer_that_is_an_account_is_keyed_under_the_connected_account() {
        let object = json!({"object": "subscription", "customer": null,
            "customer_account": "acct_cust"});
        assert_eq!(
            customer_of(object.clone(), Some("acct_platformconnected")).as_deref(),
            Some("acct_platformconnected/acct_cust")
        );
        // The platform's own customer that is an Account: no connected account.
        let id = CustomerId::parse(&customer_of(object, None).unwrap()).unwrap();
        assert_eq!(id.as_str(), "acct_cust");
        assert_eq!(id.connected_account(), None);
        assert_eq!(id.at_provider(), "acct_cust");
        // An id holding the separator names no customer rather than a wrong one.
        let slashed = json!({"object": "invoice", "customer": null,
            "customer_account": "acct_a/acct_b"});
        assert_eq!(customer_of(slashed, Some("acct_c")), None);
    }
}
