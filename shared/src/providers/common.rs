//! What the verifiers have in common: the tolerance check, the constant-time HMAC match, and
//! readers for headers and JSON.

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::HeaderMap;
use serde_json::Value;

use super::AuthError;
use crate::domain::CustomerId;

/// Checks a signed send time against the tolerance, both ways.
pub(crate) fn check_tolerance(
    sent_at: DateTime<Utc>,
    now: DateTime<Utc>,
    tolerance: Duration,
) -> Result<(), AuthError> {
    let tolerance_secs = tolerance.as_secs();
    let age = now.signed_duration_since(sent_at).num_seconds();
    let limit = i64::try_from(tolerance_secs).unwrap_or(i64::MAX);
    if age > limit {
        Err(AuthError::Stale(tolerance_secs))
    } else if -age > limit {
        Err(AuthError::Future(tolerance_secs))
    } else {
        Ok(())
    }
}

/// Whether any candidate signature is the HMAC-SHA256 of the message (given in parts) under
/// any key. `verify_slice` compares in constant time and rejects a wrong length, so a
/// truncated or empty signature never passes.
pub(crate) fn any_hmac_matches(
    keys: &[Vec<u8>],
    candidates: &[Vec<u8>],
    message: &[&[u8]],
) -> bool {
    use hmac::{Hmac, Mac};
    keys.iter().any(|key| {
        candidates.iter().any(|candidate| {
            let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(key) else {
                return false;
            };
            for part in message {
                mac.update(part);
            }
            mac.verify_slice(candidate).is_ok()
        })
    })
}

/// A header's value as text, if present and printable.
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

/// A string at a JSON pointer, if it is one.
pub(crate) fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// Customer at a pointer that holds either an id or an expanded object with an id.
pub(crate) fn customer_at(value: &Value, pointer: &str) -> Option<CustomerId> {
    let found = value.pointer(pointer)?;
    let raw = found
        .as_str()
        .or_else(|| found.get("id").and_then(Value::as_str))?;
    CustomerId::parse(raw).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn tolerance_rejects_both_directions() {
        let now = Utc.timestamp_opt(1_000_000, 0).unwrap();
        let tol = Duration::from_secs(300);
        let at = |s| Utc.timestamp_opt(s, 0).unwrap();
        assert_eq!(check_tolerance(at(1_000_000 - 300), now, tol), Ok(()));
        assert_eq!(check_tolerance(at(1_000_000 + 300), now, tol), Ok(()));
        assert_eq!(
            check_tolerance(at(1_000_000 - 301), now, tol),
            Err(AuthError::Stale(300))
        );
        assert_eq!(
            check_tolerance(at(1_000_000 + 301), now, tol),
            Err(AuthError::Future(300))
        );
    }
}
