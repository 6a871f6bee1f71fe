//! A meter report: an accepted debit told to the provider's meter (docs/design.md §4.13). Its
//! id, its dedupe key at the provider and the report as a sender reads it; the row's life is
//! `meters::outbox`'s, the wire format each provider's.

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::CustomerId;

/// A new report's id: `mrp_` and 32 hex digits (random: a report is named by its debit, and
/// a debit is written once).
pub fn report_id() -> String {
    format!("mrp_{}", uuid::Uuid::new_v4().simple())
}

/// Whether a queue message names a meter report (else it names an effect).
pub fn is_report_id(id: &str) -> bool {
    id.strip_prefix("mrp_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The report's dedupe key at the provider: the same for every attempt, derived from the
/// account and the app's idempotency key (which names the debit), so that a debit has one
/// key wherever it is reported from. `bi_` and 64 hex digits of SHA-256: 67 characters,
/// within Stripe's 100 for an `identifier` and Polar's for an `external_id`, and free of
/// anything the app or the customer chose that a provider might refuse.
pub fn identifier(source: &str, customer: &CustomerId, key: &str) -> String {
    let digest = Sha256::digest(format!("{source}\n{}\n{key}", customer.as_str()));
    format!("bi_{}", hex::encode(digest))
}

/// The dedupe key of the correction that takes a reversed debit's report back: derived from
/// the account and the debit, marked as a reversal's, so that it is never a report's.
pub fn correction_identifier(source: &str, customer: &CustomerId, usage_id: &str) -> String {
    let digest = Sha256::digest(format!(
        "{source}\n{}\n{usage_id}\nreversal",
        customer.as_str()
    ));
    format!("bi_{}", hex::encode(digest))
}

/// How a correction takes its report's value back at the provider (docs/design.md §4.13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeBack {
    /// The provider's own adjustment cancels the report of this identifier (Stripe's meter
    /// event adjustment, `type=cancel`, within its window).
    Cancel { identifier: String },
    /// A report of the opposite value (Stripe: "recording negative quantities"; a Polar
    /// meter that sums the value).
    Compensate,
}

impl TakeBack {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Cancel { .. } => "cancel",
            Self::Compensate => "compensate",
        }
    }
}

/// One report as a sender sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeterReport {
    pub id: String,
    pub source: String,
    pub customer: CustomerId,
    pub identifier: String,
    /// The meter's name at the provider (Stripe's and Polar's event name, Kinde's feature
    /// code).
    pub meter: String,
    pub value: i64,
    /// The debit's time.
    pub occurred_at: DateTime<Utc>,
    /// When a send of it first went out (`None`: never).
    pub first_sent_at: Option<DateTime<Utc>>,
    /// Whether a send ended without the provider's answer: the provider may hold it.
    pub unanswered: bool,
    /// `Some` for a correction: how it takes back the value of the report it corrects
    /// (`value` is that report's).
    pub take_back: Option<TakeBack>,
    /// This attempt's key for the provider's idempotency layer (`None`: a send outside a
    /// claim). Never the dedupe key: Stripe replays the first answer to a key for 24 hours,
    /// 500s included, so a key reused by a later attempt gets an earlier attempt's failure.
    pub send_key: Option<String>,
}

impl MeterReport {
    /// The value as the provider's meter adds it: a compensating report's is negative.
    pub fn signed_value(&self) -> i64 {
        match self.take_back {
            Some(TakeBack::Compensate) => -self.value,
            _ => self.value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debit_has_one_identifier_within_the_providers_limits() {
        let customer = CustomerId::parse("cus_1").unwrap();
        let id = identifier("stripe", &customer, "req-1");
        assert_eq!(id, identifier("stripe", &customer, "req-1"));
        assert_ne!(id, identifier("stripe", &customer, "req-2"));
        assert_ne!(id, identifier("stripe-eu", &customer, "req-1"));
        let other = CustomerId::parse("cus_2").unwrap();
        assert_ne!(id, identifier("stripe", &other, "req-1"));
        assert_eq!(id.len(), 67);
        assert!(id.len() <= 100, "Stripe's identifier takes at most 100");
        let longest_key = "k".repeat(255);
        assert_eq!(identifier("s", &customer, &longest_key).len(), 67);
        let correction = correction_identifier("stripe", &customer, "use_1");
        assert_eq!(correction.len(), 67);
        assert_ne!(correction, identifier("stripe", &customer, "use_1"));
    }

    #[test]
    fn a_report_id_is_told_from_an_effect_id() {
        let id = report_id();
        assert!(is_report_id(&id), "{id}");
        assert!(!is_report_id("eff_0123456789abcdef0123456789abcdef"));
        assert!(!is_report_id("mrp_xyz"));
    }
}
