//! The Standard Webhooks format, apart from any sender: `webhook-id`, `webhook-timestamp` and
//! `webhook-signature: v1,<base64> …`, HMAC-SHA256 over `"{id}.{timestamp}.{body}"`. It owns
//! the secrets' encodings and their decoding, the header names, the signer (what the
//! dispatcher sends to the app's endpoint and the fixtures sign test deliveries with) and the
//! check of a signed request. What a sender's events mean is its provider's
//! (`providers::standard_webhooks` for Polar and other senders).

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use chrono::{DateTime, TimeZone, Utc};
use hmac::{Hmac, Mac};
use http::HeaderMap;
use serde::Deserialize;

use super::{candidates, check_tolerance, header, signing_key, AuthError};

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// How a configured secret stands for its HMAC key (a source's `secret_encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecretEncoding {
    Base64,
    Raw,
}

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

/// The `webhook-signature` header value (one `v1,` signature): HMAC-SHA256 with `key` over
/// `"{id}.{timestamp}.{body}"`, base64. The inverse of [`Verifier::check`].
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC accepts keys of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

/// Checks requests signed with any of its keys, within a tolerance of the signed time.
pub struct Verifier {
    keys: Vec<Vec<u8>>,
    tolerance: Duration,
}

/// What a request's valid signature vouches for.
#[derive(Debug, PartialEq, Eq)]
pub struct Signed<'a> {
    /// The message id (`webhook-id`).
    pub id: &'a str,
    /// The signed send time (`webhook-timestamp`).
    pub sent_at: DateTime<Utc>,
    /// Which of the keys signed it.
    pub key: usize,
}

/// The header under its Standard Webhooks name, or the `svix-` name older senders use.
fn either<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    header(headers, name).or_else(|| {
        let svix = name.replacen("webhook-", "svix-", 1);
        header(headers, &svix)
    })
}

impl Verifier {
    pub fn new(keys: Vec<Vec<u8>>, tolerance: Duration) -> Self {
        Self { keys, tolerance }
    }

    /// Checks the time, then the signature (so a stale or forged header costs no HMAC over
    /// the body).
    pub fn check<'h>(
        &self,
        headers: &'h HeaderMap,
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Signed<'h>, AuthError> {
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
        let key = signing_key(&self.keys, &candidates, &message).ok_or(AuthError::BadSignature)?;
        Ok(Signed { id, sent_at, key })
    }
}

/// The Standard Webhooks specification's reference vector, for the format's tests and the
/// provider's.
#[cfg(test)]
pub(crate) mod reference_vector {
    pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    pub const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    pub const SENT_AT: i64 = 1_614_265_330;
    pub const BODY: &[u8] = br#"{"test": 2432232314}"#;
    pub const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    /// The vector's key, decoded.
    pub fn key() -> Vec<u8> {
        super::decode_secret(SECRET, super::SecretEncoding::Base64).unwrap()
    }

    /// The vector's delivery headers.
    pub fn headers() -> http::HeaderMap {
        super::test_headers(ID, SENT_AT, SIGNATURE)
    }
}

/// The three headers of a delivery with message id `id`, sent at `ts`, signed `sig`.
#[cfg(test)]
pub(crate) fn test_headers(id: &str, ts: i64, sig: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(ID_HEADER, id.parse().unwrap());
    h.insert(TIMESTAMP_HEADER, ts.to_string().parse().unwrap());
    h.insert(SIGNATURE_HEADER, sig.parse().unwrap());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_767_225_600;

    fn now() -> DateTime<Utc> {
        Utc.timestamp_opt(NOW, 0).unwrap()
    }

    use super::test_headers as headers;

    fn verifier(keys: &[&[u8]]) -> Verifier {
        Verifier::new(
            keys.iter().map(|k| k.to_vec()).collect(),
            Duration::from_secs(300),
        )
    }

    fn body() -> Vec<u8> {
        br#"{"type":"subscription.updated","data":{"id":"sub_1"}}"#.to_vec()
    }

    #[test]
    fn signs_the_published_test_vector() {
        use super::reference_vector as v;
        assert_eq!(
            signature(&v::key(), v::ID, v::SENT_AT, v::BODY),
            v::SIGNATURE
        );
    }

    #[test]
    fn published_test_vector_verifies() {
        use super::reference_vector as v;
        let (at, headers) = (Utc.timestamp_opt(v::SENT_AT, 0).unwrap(), v::headers());
        let signed = Verifier::new(vec![v::key()], Duration::from_secs(300))
            .check(&headers, v::BODY, at)
            .unwrap();
        assert_eq!(
            signed,
            Signed {
                id: v::ID,
                sent_at: at,
                key: 0
            }
        );
    }

    #[test]
    fn work_is_bounded_before_any_mac() {
        use crate::signing::tests::macs_of;
        let v = verifier(&[b"key_a", b"key_b"]);
        let big = vec![b'x'; 1 << 20];
        let real = format!("v1,{}", BASE64.encode([1u8; 32]));
        let (single, result) = macs_of(|| {
            v.check(&headers("msg_1", NOW, &real), &big, now())
                .map(|s| s.key)
        });
        assert_eq!((single, result.unwrap_err()), (2, AuthError::BadSignature));
        let empty = "v1, ".repeat(1000);
        let (flood, result) = macs_of(|| {
            v.check(&headers("msg_1", NOW, empty.trim()), &big, now())
                .map(|s| s.key)
        });
        assert!(matches!(result, Err(AuthError::Malformed(_))));
        assert!(flood <= 2 * single, "{flood} MACs against {single}");
        let many = format!("{real} ").repeat(1000);
        let (flood, result) = macs_of(|| {
            v.check(&headers("msg_1", NOW, many.trim()), &big, now())
                .map(|s| s.key)
        });
        assert!(matches!(result, Err(AuthError::TooManySignatures(..))));
        assert_eq!(flood, 0);
        let (macs, result) = macs_of(|| {
            v.check(&headers("msg_1", 1, &real), &big, now())
                .map(|s| s.key)
        });
        assert!(matches!(result, Err(AuthError::Stale(_))));
        assert_eq!(macs, 0);
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
        let v = Verifier::new(vec![key], Duration::from_secs(300));
        assert!(v.check(&h, br#"{"type":"x"}"#, now()).is_ok());
    }

    #[test]
    fn base64_secret_must_decode() {
        assert!(decode_secret("whsec_!!!", SecretEncoding::Base64).is_err());
        assert!(decode_secret("whsec_", SecretEncoding::Base64).is_err());
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
            let h = headers("msg_1", NOW, sig);
            let result = verifier(&[b"k"]).check(&h, &b, now());
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
    fn rotated_keys_both_verify_and_the_signer_is_named() {
        let b = body();
        let sig = signature(b"old", "msg_1", NOW, &b);
        let h = headers("msg_1", NOW, &sig);
        let signed = verifier(&[b"new", b"old"]).check(&h, &b, now()).unwrap();
        assert_eq!(signed.key, 1);
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
