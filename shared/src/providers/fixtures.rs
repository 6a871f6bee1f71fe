//! The contract for fixtures: each provider folder builds realistic payloads of its event
//! kinds and signs deliveries exactly as the provider does, for tests, `inboxctl send`,
//! `scenario` and `bench`, and the Engine Room (docs/design.md §12.5), which runs them through
//! a deployed stack's intake on test-mode sources: compiled into every build for that.

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde_json::Value;

use super::provider;
use crate::domain::SourceKind;
use crate::platform::config::SourceConfig;

/// What to put in a delivery; a field left out is none (`..Default::default()`).
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// The event kind, in the provider's own words (see [`kinds`]).
    pub kind: String,
    pub customer: String,
    /// A plan key, price id or product id from the catalog.
    pub plan: Option<String>,
    /// The provider's time for the event.
    pub at: DateTime<Utc>,
    /// The object the event is about (subscription, order, invoice, payment); derived from
    /// the customer when absent.
    pub object_id: Option<String>,
    /// For subscription events: the object's status.
    pub status: Option<String>,
    /// For subscription events: a cancellation at period end is scheduled.
    pub cancel_at_period_end: bool,
    /// The event's own id / message id; random when absent.
    pub event_id: Option<String>,
    /// For entitlement events: the feature, `key` or `key=value` (`seats=20`).
    pub feature: Option<String>,
}

/// A signed HTTP delivery: headers and body.
#[derive(Debug, Clone)]
pub struct SignedDelivery {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Where the local stand-ins of providers' services are, for the development sources that
/// point at one: the dev stack's (`inboxctl dev sources`) or a test's.
pub struct Local<'a> {
    /// The JWKS that serves the public half of the local signing key (Kinde).
    pub jwks_url: &'a str,
}

/// The local signing key for a Kinde source: a PEM private key and the `kid` its JWKS names.
pub struct KindeKey {
    pub pem: Vec<u8>,
    pub kid: String,
}

/// What each provider folder offers for development.
pub trait Fixtures: Sync {
    /// The event kinds [`Fixtures::payload`] knows that are each about an object of their
    /// own: the bench's mix cycles through them, and each of its distinct events applies.
    fn kinds(&self) -> &'static [&'static str];

    /// Kinds [`Fixtures::payload`] also builds whose events write a register a customer has one
    /// of (Stripe's entitlement summary): a later one replaces an earlier one, so the bench's
    /// mix leaves them out; `inboxctl send` takes them.
    fn customer_kinds(&self) -> &'static [&'static str] {
        &[]
    }

    /// How this provider names the development catalog's `pro` plan in its payloads (a plan
    /// key, a price id or a product id), for samples that must resolve to a plan.
    fn sample_plan(&self) -> &'static str;

    /// Whether signing needs a private key of the caller's (a [`KindeKey`]) rather than the
    /// source's configured secrets.
    fn signs_with_a_key(&self) -> bool {
        false
    }

    /// This provider's development source, as the dev stack and the tests configure it: its
    /// `INBOX_SOURCES` entry, with the dev-only secret or, for a provider that signs with a
    /// key, the local JWKS.
    fn dev_source(&self, local: &Local) -> Value;

    /// The event's payload, and its id (the dedupe key the provider would use).
    fn payload(&self, spec: &Spec) -> Result<(String, Value), String>;

    /// The event's type where this provider's payloads name it (`type`, unless it says
    /// otherwise), for a person reading what was sent.
    fn event_type<'a>(&self, payload: &'a Value) -> Option<&'a str> {
        payload["type"].as_str()
    }

    /// Signs a payload as the provider would, with the source's first secret (Kinde: the key).
    fn sign(
        &self,
        source: &SourceConfig,
        id: &str,
        payload: &Value,
        kinde_key: Option<&KindeKey>,
    ) -> Result<SignedDelivery, String>;
}

pub fn kinds(kind: SourceKind) -> &'static [&'static str] {
    provider(kind).fixtures().kinds()
}

/// Every kind [`payload`] builds for a source kind: [`kinds`], then its customer kinds.
pub fn all_kinds(kind: SourceKind) -> Vec<&'static str> {
    let fixtures = provider(kind).fixtures();
    [fixtures.kinds(), fixtures.customer_kinds()].concat()
}

/// The type of the event a payload of this source kind carries.
pub fn event_type(kind: SourceKind, payload: &Value) -> Option<&str> {
    provider(kind).fixtures().event_type(payload)
}

pub fn sample_plan(kind: SourceKind) -> &'static str {
    provider(kind).fixtures().sample_plan()
}

pub fn signs_with_a_key(kind: SourceKind) -> bool {
    provider(kind).fixtures().signs_with_a_key()
}

/// The development sources, one per provider: the `INBOX_SOURCES` of the dev stack and the
/// tests.
pub fn dev_sources(local: &Local) -> Value {
    SourceKind::ALL
        .iter()
        .map(|&kind| provider(kind).fixtures().dev_source(local))
        .collect()
}

pub fn payload(kind: SourceKind, spec: &Spec) -> Result<(String, Value), String> {
    provider(kind).fixtures().payload(spec)
}

pub fn sign_delivery(
    source: &SourceConfig,
    id: &str,
    payload: &Value,
    kinde_key: Option<&KindeKey>,
) -> Result<SignedDelivery, String> {
    provider(source.kind)
        .fixtures()
        .sign(source, id, payload, kinde_key)
}

pub(crate) fn random_id(prefix: &str) -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}{}", &id[..24])
}

pub(crate) fn unknown_kind(kind: &str, known: &[&str]) -> String {
    format!(
        "unknown event kind '{kind}'; this source knows: {}",
        known.join(", ")
    )
}

pub fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac =
        Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::Decision;
    use crate::domain::Catalog;
    use crate::providers::decide;

    #[test]
    fn every_kind_builds_a_payload_the_billing_model_applies() {
        let catalog = Catalog::parse(
            r#"{"pro":{"plan":"pro","monthly_allowance":500},"price_pro":{"plan":"pro","monthly_allowance":500},
                "prod_pro":{"plan":"pro","monthly_allowance":500},
                "pri_01gsz8x8sawmvhz1pv30nge1ke":{"plan":"pro","monthly_allowance":500},
                "101":{"plan":"pro","monthly_allowance":500}}"#,
        )
        .unwrap();
        for &source in SourceKind::ALL {
            let plan = sample_plan(source);
            for kind in all_kinds(source) {
                let spec = Spec {
                    kind: kind.to_owned(),
                    customer: "cus_1".into(),
                    plan: Some(plan.into()),
                    at: Utc::now(),
                    ..Default::default()
                };
                let (_, payload) = payload(source, &spec).unwrap();
                let event_type = event_type(source, &payload).unwrap();
                let decision = decide(source, event_type, &payload, &catalog);
                assert!(
                    matches!(decision, Decision::Apply { .. }),
                    "{source:?} {kind}: {decision:?}"
                );
            }
        }
    }

    /// A summary replaces the one before for its customer: `inboxctl send` builds it, the
    /// bench's mix (of events that each apply) leaves it out, and a wrong kind names it.
    #[test]
    fn a_customer_kind_is_sent_but_left_out_of_the_mix() {
        assert!(all_kinds(SourceKind::Stripe).contains(&"entitlements"));
        assert!(!kinds(SourceKind::Stripe).contains(&"entitlements"));
        let spec = Spec {
            kind: "entitlement".into(),
            customer: "cus_1".into(),
            at: Utc::now(),
            ..Default::default()
        };
        let refused = payload(SourceKind::Stripe, &spec).unwrap_err();
        assert!(refused.ends_with("refund, entitlements"), "{refused}");
    }

    #[test]
    fn the_dev_sources_parse_one_per_kind_each_of_its_kind() {
        let json = dev_sources(&Local {
            jwks_url: "http://127.0.0.1:61325/jwks.json",
        });
        let sources = crate::platform::config::parse_sources(&json.to_string()).unwrap();
        let kinds: Vec<SourceKind> = sources.iter().map(|s| s.kind).collect();
        assert_eq!(kinds, SourceKind::ALL);
        let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["kinde", "stripe", "polar", "lemonsqueezy", "paddle"]
        );
    }

    #[test]
    fn a_subscription_with_a_cancellation_scheduled_carries_it_as_each_provider_does() {
        let catalog = Catalog::parse(r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#).unwrap();
        for source in [SourceKind::Stripe, SourceKind::StandardWebhooks] {
            let spec = Spec {
                kind: "subscription".into(),
                customer: "cus_1".into(),
                at: Utc::now(),
                cancel_at_period_end: true,
                ..Default::default()
            };
            let (_, payload) = payload(source, &spec).unwrap();
            let event_type = payload["type"].as_str().unwrap();
            let Decision::Apply { effects, .. } = decide(source, event_type, &payload, &catalog)
            else {
                panic!("{source:?}: applied");
            };
            let Some(crate::billing::Effect::Subscription { ends, .. }) = effects.first() else {
                panic!("{source:?}: a subscription effect");
            };
            assert!(ends.cancel_at_period_end, "{source:?}");
            assert!(ends.current_period_end.is_some(), "{source:?}");
            assert_eq!(ends.cancel_at, ends.current_period_end, "{source:?}");
        }
    }

    #[test]
    fn random_ids_differ() {
        assert_ne!(random_id("x"), random_id("x"));
    }
}
