//! What the app is told (docs/design.md §11): an effect's kind, its stable id, and its outbox
//! row as written. Values only: which changes make which effects is `effects`', and an outbox
//! row's life is the outbox's.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// What the app is told: the `type` of an effect's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    PlanChanged,
    SubscriptionUpdated,
    /// The account's features moved (docs/design.md §4.12): a state, like the plan.
    FeaturesChanged,
    AllowanceGranted,
    PaymentSucceeded,
    PaymentFailed,
    PaymentRefunded,
    CustomerDeleted,
    /// A period's allowance ran out (a debit left nothing, or one was refused): once per
    /// account and period, written by the debit (`billing::usage`), not by an event.
    AllowanceExhausted,
    /// The app took an accepted debit back (docs/design.md §4.10): its amount is returned to
    /// the period's allowance and the provider's meter withdrawn or corrected (§4.13). A fact,
    /// once per debit, written by the reversal (`billing::usage`).
    UsageReversed,
    /// A credit grant became spendable (docs/design.md §4.14): a fact, once per grant.
    CreditsGranted,
    /// What remained of a credit grant expired: a fact, once per grant.
    CreditsExpired,
    /// A credit grant was voided (a pack's payment refunded, a Stripe grant voided): a fact,
    /// once per grant.
    CreditsVoided,
    /// A unit's available credits fell below the plan's low level: the balance's state at a
    /// downward crossing, told once per crossing and applied as a fact (a crossing dropped
    /// for an older sequence would be a top-up missed).
    CreditsLow,
    /// A unit's available credits ran out: as `CreditsLow`, once per downward crossing.
    CreditsDepleted,
}

impl Kind {
    /// Every kind, the one list the dispatcher, `inboxctl listen` and docs/effects.md's
    /// table of states and facts are checked against.
    pub const ALL: [Kind; 15] = [
        Kind::PlanChanged,
        Kind::SubscriptionUpdated,
        Kind::FeaturesChanged,
        Kind::AllowanceGranted,
        Kind::PaymentSucceeded,
        Kind::PaymentFailed,
        Kind::PaymentRefunded,
        Kind::CustomerDeleted,
        Kind::AllowanceExhausted,
        Kind::UsageReversed,
        Kind::CreditsGranted,
        Kind::CreditsExpired,
        Kind::CreditsVoided,
        Kind::CreditsLow,
        Kind::CreditsDepleted,
    ];

    /// The kind an effect's `type` names; `None` for a kind this build does not know.
    pub fn parse(effect_type: &str) -> Option<Kind> {
        Self::ALL.into_iter().find(|k| k.as_str() == effect_type)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::PlanChanged => "billing.plan_changed",
            Kind::SubscriptionUpdated => "billing.subscription_updated",
            Kind::FeaturesChanged => "billing.features_changed",
            Kind::AllowanceGranted => "billing.allowance_granted",
            Kind::PaymentSucceeded => "billing.payment_succeeded",
            Kind::PaymentFailed => "billing.payment_failed",
            Kind::PaymentRefunded => "billing.payment_refunded",
            Kind::CustomerDeleted => "billing.customer_deleted",
            Kind::AllowanceExhausted => "billing.allowance_exhausted",
            Kind::UsageReversed => "billing.usage_reversed",
            Kind::CreditsGranted => "billing.credits_granted",
            Kind::CreditsExpired => "billing.credits_expired",
            Kind::CreditsVoided => "billing.credits_voided",
            Kind::CreditsLow => "billing.credits_low",
            Kind::CreditsDepleted => "billing.credits_depleted",
        }
    }

    /// Whether the kind carries a state (docs/effects.md, "Order"): an app may apply it
    /// latest-`sequence`-wins. The others are facts, applied once each by id, never dropped
    /// for an older sequence: retries reorder them.
    pub fn carries_state(self) -> bool {
        matches!(
            self,
            Kind::PlanChanged | Kind::SubscriptionUpdated | Kind::FeaturesChanged
        )
    }
}

/// The stable id of an effect: `eff_` and 32 hex digits of SHA-256 over kind and cause.
pub fn effect_id(kind: Kind, cause: &str) -> String {
    let digest = Sha256::digest(format!("{}\n{cause}", kind.as_str()));
    format!("eff_{}", &hex::encode(digest)[..32])
}

/// One outbox row as the worker writes it; the account's sequence number is added by the
/// event's one statement that writes it (`inbox::commit`), which moves the account's version.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEffect {
    pub id: String,
    pub kind: Kind,
    pub cause: String,
    /// `{"id","type","occurred_at","data"}`, without `data.sequence` yet.
    pub body: Value,
}
