//! Standard Webhooks signing: what the dispatcher sends to the app's endpoint, and what the
//! development fixtures sign test deliveries with. The inverse of [`super::StandardVerifier`].

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};

/// The `webhook-signature` header value (one `v1,` signature): HMAC-SHA256 with `key` over
/// `"{id}.{timestamp}.{body}"`, base64.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SecretEncoding;
    use crate::providers::standard_webhooks::decode_secret;

    #[test]
    fn signs_the_published_test_vector() {
        // The Standard Webhooks specification's reference vector.
        let key = decode_secret(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            SecretEncoding::Base64,
        )
        .unwrap();
        assert_eq!(
            signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
