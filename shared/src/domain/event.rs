//! A delivery whose signature checked out, as the providers hand it to the inbox.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{ContentHash, CustomerId, DedupeKey, ProviderTime};

/// What a provider's parser learned from a verified envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMeta {
    pub event_type: String,
    pub customer: Option<CustomerId>,
    pub occurred_at: ProviderTime,
}

/// A delivery whose signature checked out. It is stored whether or not it parses:
/// an unparseable one is kept as evidence and marked unprocessable.
#[derive(Debug, Clone)]
pub struct VerifiedEvent {
    pub dedupe_key: DedupeKey,
    pub content_hash: ContentHash,
    /// The signed content as JSON (for Kinde, the token's claims), when it is JSON.
    pub payload: Option<Value>,
    /// The signed send time of this attempt.
    pub sent_at: Option<DateTime<Utc>>,
    /// The provider's id for this delivery or message, when it sends one.
    pub delivery_id: Option<String>,
    /// Which of the source's secrets signed it (its index in the configured list), for a
    /// secret-signed delivery: an operator rolling a secret watches the old one fall silent.
    pub signed_with: Option<usize>,
    pub meta: Result<EventMeta, String>,
}
