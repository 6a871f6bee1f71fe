//! Standard Webhooks senders' deliveries (Polar, Svix-style senders): the signature checked by
//! the format ([`crate::signing::standard_webhooks`]), then the envelope read — the message id
//! as the dedupe key, the type, the customer and the provider time.

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::HeaderMap;
use serde_json::Value;

use crate::domain::{ContentHash, DedupeKey, EventMeta, ProviderTime, VerifiedEvent};
use crate::providers::common::{customer_at, str_at};
use crate::providers::CheckNow;
use crate::signing::standard_webhooks::Verifier;
use crate::signing::AuthError;

/// A Standard Webhooks sender's deliveries: the format's check, then the event read.
pub struct StandardVerifier {
    format: Verifier,
}

impl StandardVerifier {
    pub fn new(keys: Vec<Vec<u8>>, tolerance: Duration) -> Self {
        Self {
            format: Verifier::new(keys, tolerance),
        }
    }
}

impl CheckNow for StandardVerifier {
    /// Checks the time and the signature (the format's), then reads the event.
    fn check(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<VerifiedEvent, AuthError> {
        let signed = self.format.check(headers, body, now)?;
        let mut event = parse_event(signed.id, body, signed.sent_at);
        event.signed_with = Some(signed.key);
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

/// Provider time: the object's own times first — its `modified_at`, else its `created_at` —
/// then the envelope's `timestamp`, else the signed send time (the latest the event can have
/// happened). Polar stamps an object's `created_at` when its row is inserted and `modified_at`
/// on every later update, null until then (`TimestampedModel`, server/polar/kit/db/models/
/// base.py); the envelope's `timestamp` is the clock when the webhook is sent
/// (`WebhookService.send`, server/polar/webhook/service.py), after the change and whatever
/// work came between. A new object (`subscription.created`, `benefit_grant.created`, an order
/// paid at once) has no `modified_at` yet: ordered by its envelope, it would sort after a
/// change made to it before its webhook went out (a grant revoked at once), and win.
fn meta(payload: &Value, sent_at: DateTime<Utc>) -> Result<EventMeta, String> {
    let event_type = str_at(payload, "/type").ok_or("the event has no type")?;
    let occurred_at = ["/data/modified_at", "/data/created_at", "/timestamp"]
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
    use crate::signing::standard_webhooks::signature;
    use chrono::TimeZone;
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

    use crate::signing::standard_webhooks::test_headers as headers;

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
    fn published_test_vector_verifies() {
        // The Standard Webhooks specification's reference vector, through the provider.
        use crate::signing::standard_webhooks::reference_vector as rv;
        let v = StandardVerifier::new(vec![rv::key()], Duration::from_secs(300));
        let at = Utc.timestamp_opt(rv::SENT_AT, 0).unwrap();
        let event = v.check(&rv::headers(), rv::BODY, at).unwrap();
        assert_eq!(event.dedupe_key.as_str(), rv::ID);
        assert_eq!(event.meta.unwrap_err(), "the event has no type");
    }

    #[test]
    fn valid_delivery_is_parsed_in_provider_time() {
        let b = body();
        let sig = signature(b"k", "msg_1", NOW, &b);
        let event = StandardVerifier::new(vec![b"k".to_vec()], Duration::from_secs(300))
            .check(&headers("msg_1", NOW, &sig), &b, now())
            .unwrap();
        assert_eq!(event.signed_with, Some(0));
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
    fn a_forged_delivery_is_refused_before_it_is_read() {
        let b = body();
        let sig = signature(b"other", "msg_1", NOW, &b);
        let v = StandardVerifier::new(vec![b"k".to_vec()], Duration::from_secs(300));
        assert_eq!(
            v.check(&headers("msg_1", NOW, &sig), &b, now())
                .unwrap_err(),
            AuthError::BadSignature
        );
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

    #[test]
    fn a_benefit_grant_is_its_customers_at_the_grants_time() {
        let corpus = |name: &str| -> Value {
            let path = format!(
                "{}/../testdata/providers/polar/{name}.json",
                env!("CARGO_MANIFEST_DIR")
            );
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
        };
        // A new grant has no modified_at yet: its created_at is its time, not the later
        // envelope timestamp (2025-12-01T10:00:04.391207Z).
        let created = meta(&corpus("benefit_grant.created"), now()).unwrap();
        assert_eq!(
            created.customer.unwrap().as_str(),
            "c1a124cb-d614-4eeb-91b9-1802cb91d276",
            "Polar's customer id, as for its subscriptions, not the external id"
        );
        assert_eq!(
            created.occurred_at,
            ProviderTime::parse_rfc3339("2025-12-01T10:00:04.321977Z").unwrap()
        );
        let revoked = meta(&corpus("benefit_grant.revoked"), now()).unwrap();
        assert_eq!(
            revoked.occurred_at,
            ProviderTime::parse_rfc3339("2026-01-22T10:02:32.107455Z").unwrap()
        );
    }

    #[test]
    fn an_objects_own_times_come_before_the_envelopes() {
        let at = |data: Value| {
            let p = json!({"type": "subscription.created", "timestamp": "2026-01-01T00:00:05Z",
                           "data": data});
            meta_time(&p)
        };
        let time = |s: &str| ProviderTime::parse_rfc3339(s).unwrap();
        assert_eq!(
            at(
                json!({"created_at": "2026-01-01T00:00:00Z", "modified_at": "2026-01-01T00:00:02Z"})
            ),
            time("2026-01-01T00:00:02Z")
        );
        assert_eq!(
            at(json!({"created_at": "2026-01-01T00:00:00Z", "modified_at": null})),
            time("2026-01-01T00:00:00Z")
        );
        assert_eq!(at(json!({"id": "sub_1"})), time("2026-01-01T00:00:05Z"));
    }

    fn meta_time(p: &Value) -> ProviderTime {
        meta(p, now()).unwrap().occurred_at
    }
}
