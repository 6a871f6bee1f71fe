//! Kinde deliveries for development: billing event claims as Kinde sends them, signed as an
//! RS256 JWT with a local key whose public half a local JWKS serves.

use chrono::Utc;
use serde::Serialize;
use serde_json::{json, Value};

use crate::domain::SourceKind;
use crate::platform::config::SourceConfig;
use crate::providers::fixtures::{
    random_id, unknown_kind, Fixtures, KindeKey, Local, SignedDelivery, Spec,
};

pub struct KindeFixtures;

const KINDS: &[&str] = &[
    "plan-assigned",
    "plan-changed",
    "agreement-cancelled",
    "payment-succeeded",
    "payment-failed",
    "invoice-overdue",
];

/// A Kinde webhook token: the claims signed RS256 with a PEM private key, naming `kid`.
pub fn token(
    private_key_pem: &[u8],
    kid: &str,
    claims: &impl Serialize,
) -> Result<String, jsonwebtoken::errors::Error> {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(private_key_pem)?;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &key)
}

impl Fixtures for KindeFixtures {
    fn kinds(&self) -> &'static [&'static str] {
        KINDS
    }

    fn sample_plan(&self) -> &'static str {
        "pro"
    }

    fn signs_with_a_key(&self) -> bool {
        true
    }

    /// Verified with the local JWKS: its tokens are signed with a local key, not a secret.
    fn dev_source(&self, local: &Local) -> Value {
        json!({"name": "kinde", "kind": SourceKind::Kinde.as_str(), "jwks_url": local.jwks_url})
    }

    fn payload(&self, spec: &Spec) -> Result<(String, Value), String> {
        let event_id = spec.event_id.clone().unwrap_or_else(|| random_id("event_"));
        let event_type = match spec.kind.as_str() {
            "plan-assigned" => "customer.plan_assigned",
            "plan-changed" => "customer.plan_changed",
            "agreement-cancelled" => "customer.agreement_cancelled",
            "payment-succeeded" => "customer.payment_succeeded",
            "payment-failed" => "customer.payment_failed",
            "invoice-overdue" => "customer.invoice_overdue",
            other => return Err(unknown_kind(other, KINDS)),
        };
        let mut data = json!({"customer_id": spec.customer});
        if let Some(plan) = &spec.plan {
            data["plan"] = json!({"key": plan, "name": plan});
        }
        if event_type.contains("payment") {
            data["payment_id"] = json!(spec.object_id.clone().unwrap_or_else(|| random_id("pay_")));
        }
        Ok((
            event_id.clone(),
            json!({"type": event_type, "event_id": event_id, "event_timestamp": spec.at.to_rfc3339(),
                   "timestamp": Utc::now().to_rfc3339(), "source": "api", "data": data}),
        ))
    }

    fn sign(
        &self,
        _source: &SourceConfig,
        id: &str,
        payload: &Value,
        kinde_key: Option<&KindeKey>,
    ) -> Result<SignedDelivery, String> {
        let key = kinde_key
            .ok_or("a Kinde delivery needs the local signing key (INBOX_DEV_KINDE_KEY)")?;
        let token =
            token(&key.pem, &key.kid, payload).map_err(|e| format!("signing the token: {e}"))?;
        Ok(SignedDelivery {
            headers: vec![
                ("content-type".into(), "application/jwt".into()),
                (super::ID_HEADER.into(), id.to_owned()),
            ],
            body: token.into_bytes(),
        })
    }
}
