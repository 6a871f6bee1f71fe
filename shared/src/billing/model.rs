//! The billing model as plain values and functions (docs/design.md §4): the effects an event
//! asks for, the version that orders writes to one register, what a grant is, which outcome
//! an event has, and the plan an account derives from its registers. The providers' `decide`
//! functions build these values; `registers` persists them.

use serde_json::Value;

use super::catalog::{Catalog, PlanRef};
use crate::domain::{CustomerId, DedupeKey, EventStatus, Period, ProviderTime};

/// A register's version: the provider's time, then the dedupe key, so the order is total.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub at: ProviderTime,
    pub key: DedupeKey,
}

/// The ledger key that makes a grant happen once per account, period and plan.
pub fn allowance_entry_key(
    source: &str,
    customer: &CustomerId,
    period: &Period,
    plan: &str,
) -> String {
    format!("allowance:{source}/{customer}:{period}:{plan}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentStatus {
    Paid,
    Failed,
    Refunded,
}

impl PaymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Paid => "paid",
            Self::Failed => "failed",
            Self::Refunded => "refunded",
        }
    }
}

/// A subscription status entitles its customer while `active` or `trialing`.
pub fn status_entitles(status: &str) -> bool {
    matches!(status, "active" | "trialing")
}

/// One write an event asks for. Each is applied by one conditional statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The customer's plan register; `None` is "no plan" (a cancelled agreement).
    CustomerPlan { plan: Option<PlanRef> },
    /// The customer's payment standing register (Kinde).
    Standing { past_due: bool },
    /// A subscription's register: the whole object's status and plan.
    Subscription {
        id: String,
        status: String,
        plan: Option<PlanRef>,
    },
    /// A payment's register; refunded is terminal.
    Payment {
        id: String,
        status: PaymentStatus,
        plan_key: Option<String>,
    },
    /// The plan's allowance for the period of the event's provider time.
    Grant { plan: PlanRef },
    /// The customer is deleted: a tombstone later events cannot lift.
    DeleteCustomer,
}

/// What an event means for the billing state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Apply(Vec<Effect>),
    /// Nothing to do, and why.
    Ignore(String),
    /// The payload cannot be read as this event type; retrying cannot help.
    Unprocessable(String),
}

/// Why a provider's `decide` could not reach a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Unreadable(String),
    UnknownPlan(String),
}

impl From<Problem> for Decision {
    fn from(problem: Problem) -> Self {
        match problem {
            Problem::Unreadable(reason) => Decision::Unprocessable(reason),
            Problem::UnknownPlan(key) => {
                Decision::Ignore(format!("plan key '{key}' is not in the plan catalog"))
            }
        }
    }
}

/// What a provider's `decide` returns: a decision, or why there is none.
pub type Decided = Result<Decision, Problem>;

/// The reading helpers every provider's `decide` uses on its payload.
pub mod read {
    use super::*;

    /// A non-blank string at a JSON pointer.
    pub fn text<'a>(payload: &'a Value, pointer: &str) -> Option<&'a str> {
        payload
            .pointer(pointer)
            .and_then(Value::as_str)
            .filter(|s| !s.trim().is_empty())
    }

    pub fn required<'a>(payload: &'a Value, pointer: &str) -> Result<&'a str, Problem> {
        text(payload, pointer)
            .ok_or_else(|| Problem::Unreadable(format!("no {pointer} in the payload")))
    }

    pub fn first_text<'a>(payload: &'a Value, pointers: &[&str]) -> Option<&'a str> {
        pointers.iter().find_map(|p| text(payload, p))
    }

    /// Resolves plan keys against the catalog: a named but unknown key is a problem.
    pub fn resolve(catalog: &Catalog, candidates: &[&str]) -> Result<Option<PlanRef>, Problem> {
        catalog.resolve(candidates).map_err(Problem::UnknownPlan)
    }
}

/// The effects, plus the plan's grant when there is a plan.
pub fn with_grant(mut effects: Vec<Effect>, plan: &Option<PlanRef>) -> Vec<Effect> {
    if let Some(plan) = plan {
        effects.push(Effect::Grant { plan: plan.clone() });
    }
    effects
}

/// An event type the provider sends that says nothing about billing.
pub fn no_meaning(event_type: &str) -> Decision {
    Decision::Ignore(format!("{event_type} carries no billing state"))
}

/// An event type that is not a billing event at all.
pub fn not_billing(event_type: &str) -> Decision {
    Decision::Ignore(format!("event type {event_type} is not a billing event"))
}

/// A subscription event records the object's state; an entitling state also grants its plan
/// for the event's period.
pub fn subscription_effects(id: String, status: String, plan: Option<PlanRef>) -> Decision {
    let grant = if status_entitles(&status) {
        plan.clone()
    } else {
        None
    };
    Decision::Apply(with_grant(
        vec![Effect::Subscription { id, status, plan }],
        &grant,
    ))
}

/// What one effect did to its register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The register moved; the words say how.
    Made(String),
    /// The register already holds this very event: re-applying it is a no-op.
    AlreadyApplied(String),
    /// The register holds something that wins over this event; the words say what.
    Superseded(String),
}

/// An event is applied when one of its writes took effect, or all of them already hold this
/// very event (a replay); it is ignored, with the first reason, when something newer won.
pub fn outcome(changes: &[Change]) -> (EventStatus, String) {
    let made: Vec<&str> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Made(words) => Some(words.as_str()),
            _ => None,
        })
        .collect();
    let superseded = changes.iter().find_map(|c| match c {
        Change::Superseded(words) => Some(words.as_str()),
        _ => None,
    });
    let kept: Vec<&str> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Made(_) => None,
            Change::AlreadyApplied(words) | Change::Superseded(words) => Some(words.as_str()),
        })
        .collect();
    match (made.is_empty(), superseded) {
        (false, _) if kept.is_empty() => (EventStatus::Applied, made.join("; ")),
        (false, _) => (
            EventStatus::Applied,
            format!("{}; {}", made.join("; "), kept.join("; ")),
        ),
        (true, Some(words)) => (EventStatus::Ignored, words.to_owned()),
        (true, None) => (EventStatus::Applied, kept.join("; ")),
    }
}

pub const FREE: &str = "free";

/// The account's plan, derived from its registers: the best entitlement it holds, `free`
/// when none. A tombstoned customer holds nothing.
pub fn derive_plan<'a>(
    deleted: bool,
    customer_plan: Option<&'a str>,
    past_due: bool,
    entitling_subscription_plans: impl IntoIterator<Item = &'a str>,
    catalog: &Catalog,
) -> String {
    if deleted {
        return FREE.to_owned();
    }
    let kinde = customer_plan.filter(|_| !past_due);
    kinde
        .into_iter()
        .chain(entitling_subscription_plans)
        .max_by_key(|plan| (catalog.allowance_of(plan).unwrap_or(0), plan.to_string()))
        .map(str::to_owned)
        .unwrap_or_else(|| FREE.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"{"pro":{"plan":"pro","monthly_allowance":500},
                "prod_team":{"plan":"team","monthly_allowance":2000}}"#,
        )
        .unwrap()
    }

    #[test]
    fn derived_plan_is_the_best_entitlement() {
        let c = catalog();
        assert_eq!(derive_plan(false, None, false, [], &c), "free");
        assert_eq!(derive_plan(false, Some("pro"), false, ["team"], &c), "team");
        assert_eq!(derive_plan(false, Some("pro"), true, [], &c), "free");
        assert_eq!(derive_plan(true, Some("pro"), false, ["team"], &c), "free");
    }

    #[test]
    fn outcome_words() {
        let made = Change::Made("plan set to pro".into());
        let newer = Change::Superseded("a newer plan change is already stored".into());
        let granted = Change::Superseded("the pro allowance for 2026-03 is already granted".into());
        let again = Change::AlreadyApplied("this plan change is already stored".into());
        assert_eq!(outcome(std::slice::from_ref(&made)).0, EventStatus::Applied);
        assert_eq!(
            outcome(std::slice::from_ref(&newer)),
            (
                EventStatus::Ignored,
                "a newer plan change is already stored".to_owned()
            )
        );
        assert_eq!(outcome(&[newer, granted.clone()]).0, EventStatus::Ignored);
        assert_eq!(outcome(&[made, granted]).0, EventStatus::Applied);
        assert_eq!(outcome(&[again]).0, EventStatus::Applied);
    }

    #[test]
    fn unknown_plan_is_ignored_with_its_key() {
        assert_eq!(
            Decision::from(Problem::UnknownPlan("gold".into())),
            Decision::Ignore("plan key 'gold' is not in the plan catalog".into())
        );
    }
}
