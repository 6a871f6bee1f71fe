//! What every signature check shares, below the providers and the effects: [`AuthError`] (why a
//! delivery is refused), the tolerance check, the cap on candidate signatures, the
//! constant-time HMAC match and the header reader; and [`standard_webhooks`], the one signature
//! format the inbox both receives and sends (docs/design.md §2.1).

pub mod standard_webhooks;
pub(crate) mod timestamped;

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::HeaderMap;

/// Why a delivery was not accepted as coming from the provider. Every variant but
/// `KeysUnavailable` is the sender's fault (401); that one is ours (503, the provider retries).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("{0}: more than {1} signatures")]
    TooManySignatures(&'static str, usize),
    #[error("signature does not match")]
    BadSignature,
    #[error("timestamp is older than the {0} s tolerance")]
    Stale(u64),
    #[error("timestamp is further than {0} s in the future")]
    Future(u64),
    #[error("signing key id '{0}' is not in the provider's key set")]
    UnknownKey(String),
    #[error("signing algorithm '{0}' is not allowed")]
    AlgorithmNotAllowed(String),
    #[error("signing key '{0}' is not an RSA key")]
    WrongKeyType(String),
    #[error("the provider's signing keys could not be fetched")]
    KeysUnavailable,
}

impl AuthError {
    /// A short name for why, as the `Reason` of the `RejectedDeliveries` metric: a few fixed
    /// values, never a key id or anything else the sender chose.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing(_) => "missing",
            Self::Malformed(_) => "malformed",
            Self::TooManySignatures(..) => "too_many_signatures",
            Self::BadSignature => "bad_signature",
            Self::Stale(_) => "stale",
            Self::Future(_) => "future",
            Self::UnknownKey(_) => "unknown_key",
            Self::AlgorithmNotAllowed(_) => "algorithm_not_allowed",
            Self::WrongKeyType(_) => "wrong_key_type",
            Self::KeysUnavailable => "keys_unavailable",
        }
    }
}

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

/// At most this many signatures are tried per delivery. Senders sign once per active secret
/// (two while one rolls), so more is noise or an attempt to make the intake work for nothing.
pub const MAX_SIGNATURES: usize = 16;

/// The candidate signatures of a header, decoded: empty ones dropped, at most
/// [`MAX_SIGNATURES`], at least one. Decoding stops at the first one over the cap, so a huge
/// header costs no more than reading it.
pub(crate) fn candidates(
    encoded: impl Iterator<Item = Option<Vec<u8>>>,
    what: &'static str,
) -> Result<Vec<Vec<u8>>, AuthError> {
    let mut found = Vec::new();
    for candidate in encoded.flatten().filter(|c| !c.is_empty()) {
        if found.len() == MAX_SIGNATURES {
            return Err(AuthError::TooManySignatures(what, MAX_SIGNATURES));
        }
        found.push(candidate);
    }
    if found.is_empty() {
        return Err(AuthError::Malformed(what));
    }
    Ok(found)
}

/// Which configured key signed the message (given in parts), if any: the HMAC-SHA256 of the
/// message is computed once per key, whatever the number of candidates, and compared to each
/// candidate in constant time (a candidate of the wrong length never matches). The index
/// tells an operator rolling a secret which one senders still use.
pub(crate) fn signing_key(
    keys: &[Vec<u8>],
    candidates: &[Vec<u8>],
    message: &[&[u8]],
) -> Option<usize> {
    use hmac::{Hmac, Mac};
    use subtle::ConstantTimeEq;
    keys.iter().position(|key| {
        let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(key) else {
            return false;
        };
        for part in message {
            mac.update(part);
        }
        #[cfg(test)]
        MACS.with(|n| n.set(n.get() + 1));
        let tag = mac.finalize().into_bytes();
        candidates
            .iter()
            .fold(subtle::Choice::from(0), |found, c| {
                found | c.as_slice().ct_eq(tag.as_slice())
            })
            .into()
    })
}

#[cfg(test)]
thread_local! {
    /// How many MACs this thread computed: the work a delivery cost, counted, not timed.
    pub(crate) static MACS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A header's value as text, if present and printable.
pub(crate) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chrono::TimeZone;

    /// The MACs computed while running `f`.
    pub(crate) fn macs_of<T>(f: impl FnOnce() -> T) -> (usize, T) {
        let before = MACS.with(|n| n.get());
        let out = f();
        (MACS.with(|n| n.get()) - before, out)
    }

    #[test]
    fn empty_candidates_are_dropped_and_too_many_refused() {
        let some = |n: usize, len: usize| (0..n).map(move |_| Some(vec![7u8; len]));
        assert_eq!(
            candidates(some(1000, 0), "sig"),
            Err(AuthError::Malformed("sig"))
        );
        assert_eq!(
            candidates(some(MAX_SIGNATURES + 1, 32), "sig"),
            Err(AuthError::TooManySignatures("sig", MAX_SIGNATURES))
        );
        let kept = candidates(some(3, 0).chain(some(MAX_SIGNATURES, 32)), "sig").unwrap();
        assert_eq!(kept.len(), MAX_SIGNATURES);
    }

    #[test]
    fn one_mac_per_key_whatever_the_candidates() {
        let keys = vec![b"old".to_vec(), b"new".to_vec()];
        let message: [&[u8]; 1] = [b"body"];
        let wrong = vec![vec![0u8; 32]; MAX_SIGNATURES];
        let (macs, matched) = macs_of(|| signing_key(&keys, &wrong, &message));
        assert_eq!((macs, matched), (2, None));
        use hmac::{Hmac, Mac};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"new").unwrap();
        mac.update(b"body");
        let right = mac.finalize().into_bytes().to_vec();
        let (macs, matched) = macs_of(|| signing_key(&keys, &[right], &message));
        assert_eq!((macs, matched), (2, Some(1)), "the index names the secret");
    }

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
