//! The timestamped HMAC scheme Stripe and Paddle share: a header of `<time key>=<unix
//! seconds>` beside one `<signature key>=<hex HMAC-SHA256>` per secret the sender signs with
//! (several while a secret rolls), over `"{seconds}{joiner}{body}"`. Stripe: `Stripe-Signature:
//! t=…,v1=…` over `"{t}.{body}"`; Paddle: `Paddle-Signature: ts=…;h1=…` over `"{ts}:{body}"`.
//! The time is checked before any HMAC, so a stale or forged header costs none over the body.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use http::HeaderMap;

use super::{candidates, check_tolerance, header, signing_key, AuthError};

/// One provider's spelling of the scheme; the `&'static str`s are its errors' words.
pub(crate) struct Scheme {
    /// The header's name, lowercase.
    pub header: &'static str,
    /// The header as errors name it (`Stripe-Signature`).
    pub shown: &'static str,
    pub separator: char,
    pub time_key: &'static str,
    pub signature_key: &'static str,
    /// What joins the seconds and the body in the signed message.
    pub joiner: &'static [u8],
    /// The error of a time that is not unix seconds.
    pub bad_time: &'static str,
    /// The error of a header without the time.
    pub no_time: &'static str,
    /// The error of a header without a signature of the trusted key.
    pub no_signature: &'static str,
}

/// The time it was sent at, and which of `secrets` signed it, when the header's time is
/// within `tolerance` of `now` and one of its signatures is the body's under one of them. A
/// signature that is not hex can never match: it is skipped, not fatal, so that a valid one
/// beside it still counts; keys other than the two are ignored (Stripe's test-mode `v0`).
pub(crate) fn check(
    scheme: &Scheme,
    secrets: &[Vec<u8>],
    tolerance: Duration,
    (headers, body): (&HeaderMap, &[u8]),
    now: DateTime<Utc>,
) -> Result<(DateTime<Utc>, usize), AuthError> {
    let raw = header(headers, scheme.header).ok_or(AuthError::Missing(scheme.shown))?;
    let mut seconds = None;
    let mut signatures = Vec::new();
    for part in raw.split(scheme.separator) {
        let Some((key, value)) = part.trim().split_once('=') else {
            continue;
        };
        if key == scheme.time_key {
            let parsed = value
                .parse::<i64>()
                .map_err(|_| AuthError::Malformed(scheme.bad_time))?;
            seconds = Some(parsed);
        } else if key == scheme.signature_key {
            signatures.push(hex::decode(value).ok());
        }
    }
    let seconds = seconds.ok_or(AuthError::Malformed(scheme.no_time))?;
    let signatures = candidates(signatures.into_iter(), scheme.no_signature)?;
    let sent_at = Utc
        .timestamp_opt(seconds, 0)
        .single()
        .ok_or(AuthError::Malformed(scheme.bad_time))?;
    check_tolerance(sent_at, now, tolerance)?;
    let seconds = seconds.to_string();
    let message: [&[u8]; 3] = [seconds.as_bytes(), scheme.joiner, body];
    let secret = signing_key(secrets, &signatures, &message).ok_or(AuthError::BadSignature)?;
    Ok((sent_at, secret))
}
