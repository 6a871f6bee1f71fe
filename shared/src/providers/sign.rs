//! Signing deliveries exactly as each provider does: for tests, `inboxctl send` and demos.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;

fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

pub fn hmac_sha256_hex(key: &[u8], message: &[u8]) -> String {
    hex::encode(hmac_sha256(key, message))
}

/// The `Stripe-Signature` header value for a body sent at `t`.
pub fn stripe_signature(secret: &[u8], t: i64, body: &[u8]) -> String {
    let signed = [format!("{t}.").as_bytes(), body].concat();
    format!("t={t},v1={}", hmac_sha256_hex(secret, &signed))
}

/// The `webhook-signature` header value (one `v1,` signature) for a Standard Webhooks message.
pub fn standard_signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let signed = [format!("{id}.{timestamp}.").as_bytes(), body].concat();
    format!("v1,{}", BASE64.encode(hmac_sha256(key, &signed)))
}

/// A Kinde webhook token: the claims signed RS256 with a PEM private key, naming `kid`.
pub fn kinde_token(
    private_key_pem: &[u8],
    kid: &str,
    claims: &impl Serialize,
) -> Result<String, jsonwebtoken::errors::Error> {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(private_key_pem)?;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &key)
}
