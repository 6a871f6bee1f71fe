//! Polar's `meter_credit` benefit mirrored as credit grants (docs/design.md §6.3, §4.14): each
//! crediting of a benefit grant — its grant, each cycle — is one grant of the credits fold,
//! keyed by the benefit grant and the crediting's time as Polar records it, so every event
//! that names the same crediting meets the same register.
//!
//! What Polar does, and so what is read (polarsource/polar
//! `server/polar/benefit/strategies/meter_credit/service.py`, `BenefitMeterCreditService`):
//! - `grant` (a new grant, a grant given again after a revocation, an update) credits the
//!   benefit's `units` to its meter and stores on the grant `last_credited_meter_id`,
//!   `last_credited_units` and `last_credited_at` (`utc_now().isoformat()`);
//! - `cycle` (the subscription's renewal) resets the meter — the customer's balance starts
//!   again at nothing — and credits what rolls over (`rollover`: the meter's balance, at most
//!   the units credited with rollover, `customer_meter/service.py` `get_rollover_units`), then
//!   credits `units` again with a new `last_credited_at`;
//! - `revoke` credits `-last_credited_units` (the last crediting taken back) and stores that
//!   negative crediting as the grant's properties; it is skipped when another grant of the
//!   benefit still holds it for the customer (`BenefitGrantService.revoke_benefit`,
//!   `benefit/grant/service.py`), and then the properties are unchanged.
//!
//! Every `benefit_grant.*` webhook carries the grant's `properties` and, since each is sent
//! after the strategy ran, its `previous_properties` (`BenefitGrantMeterCreditWebhook`,
//! `benefit/schemas.py`; `_send_webhook` in `benefit/grant/service.py`), so one event names
//! the crediting it made and the one before it: a cycle ends the one before (without
//! rollover), a revocation voids it.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::Value;

use crate::billing::credits::{Category, GrantSnapshot, Origin, Quantity, ALLOWANCE_UNIT};
use crate::billing::model::read::{iso_time, required, text};
use crate::billing::Problem;

/// One crediting of a meter, as a grant's `properties` (or `previous_properties`) record it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Crediting {
    /// `last_credited_at`, to the microsecond, in one spelling: the crediting's identity.
    at: DateTime<Utc>,
    /// `last_credited_units`: negative when a revocation took a crediting back.
    units: i64,
}

/// The crediting recorded at `pointer` (`/properties`, `/previous_properties`). Polar's
/// properties are a partial dict (`total=False`): a grant never credited (`{}`, or `null`
/// before any) names none.
fn crediting(data: &Value, pointer: &str) -> Result<Option<Crediting>, Problem> {
    let at = iso_time(data, &format!("{pointer}/last_credited_at"))?;
    let units = match data.pointer(&format!("{pointer}/last_credited_units")) {
        None | Some(Value::Null) => None,
        Some(units) => Some(units.as_i64().ok_or_else(|| {
            Problem(format!(
                "{pointer}/last_credited_units is {units}: a whole number"
            ))
        })?),
    };
    Ok(match (at, units) {
        (Some(at), Some(units)) => Some(Crediting { at, units }),
        _ => None,
    })
}

/// The grant id of a crediting: `meter_credit:{benefit grant}:{last_credited_at}`.
pub fn grant_id(benefit_grant: &str, credited_at: DateTime<Utc>) -> String {
    format!(
        "meter_credit:{benefit_grant}:{}",
        credited_at.to_rfc3339_opts(SecondsFormat::Micros, true)
    )
}

/// The unit of a meter credit's grants: the benefit's `metadata.unit` when it names one (a
/// debit of that unit spends them), else `credits`, the unit of the monthly allowance and of
/// catalog packs, which a debit names by default. Not the meter's id: the app debits in its
/// own words, and Polar's meter is what the debits are reported to (§4.13).
fn unit(benefit: &Value) -> Result<String, Problem> {
    match benefit.pointer("/metadata/unit") {
        None | Some(Value::Null) => Ok(ALLOWANCE_UNIT.to_owned()),
        Some(Value::String(unit)) if !unit.trim().is_empty() => Ok(unit.clone()),
        Some(other) => Err(Problem(format!(
            "the benefit's metadata.unit is {other}: a unit is a non-blank string"
        ))),
    }
}

/// The credit grants a Polar benefit grant's event says (docs/design.md §6.3): none unless
/// its benefit is a `meter_credit`; else the crediting its `properties` name (when it
/// credited units), and the crediting its `previous_properties` name when another took its
/// place — ended at the new crediting's time by a cycle without rollover (Polar reset the
/// meter), voided at the negative crediting's time by a revocation that took it back. Each
/// snapshot is versioned by the event's own time (`modified_at`, else `created_at`), so the
/// event that knows the most about a crediting (the cycle or revocation after it) is the one
/// its register keeps, in every order; `event_key` is the tie-break of one second.
pub fn meter_credit_grants(
    event_type: &str,
    data: &Value,
    event_key: &str,
) -> Result<Vec<GrantSnapshot>, Problem> {
    let Some(benefit) = data.get("benefit").filter(|b| b.is_object()) else {
        return Ok(Vec::new());
    };
    if text(benefit, "/type") != Some("meter_credit") {
        return Ok(Vec::new());
    }
    let benefit_grant = required(data, "/id")?;
    let rollover = benefit
        .pointer("/properties/rollover")
        .and_then(Value::as_bool)
        .ok_or_else(|| Problem("no boolean /benefit/properties/rollover in the payload".into()))?;
    let unit = unit(benefit)?;
    let updated = iso_time(data, "/modified_at")?
        .or(iso_time(data, "/created_at")?)
        .ok_or_else(|| Problem("no /modified_at or /created_at in the payload".into()))?
        .timestamp();
    let snapshot = |c: &Crediting| GrantSnapshot {
        grant_id: grant_id(benefit_grant, c.at),
        origin: Origin::PolarMeterCredit,
        unit: unit.clone(),
        scope: "all".to_owned(),
        amount: Quantity::whole(c.units),
        // Credits that come with a purchase (a subscription's or an order's benefit).
        category: Category::Paid,
        priority: None,
        created: c.at.timestamp(),
        effective_at: Some(c.at.timestamp()),
        expires_at: None,
        voided_at: None,
        updated,
        event_key: event_key.to_owned(),
    };
    let now = crediting(data, "/properties")?;
    let before = crediting(data, "/previous_properties")?;
    let mut grants = Vec::new();
    if let Some(now) = now.as_ref().filter(|c| c.units > 0) {
        grants.push(snapshot(now));
    }
    if let Some(before) =
        before.filter(|b| b.units > 0 && Some(&b.at) != now.as_ref().map(|n| &n.at))
    {
        let mut grant = snapshot(&before);
        match &now {
            // A revocation took the last crediting back: what remains of it is void.
            Some(now) if now.units < 0 => grant.voided_at = Some(now.at.timestamp()),
            // A cycle reset the meter: without rollover the crediting ends there.
            Some(now) if event_type == "benefit_grant.cycled" && !rollover => {
                grant.expires_at = Some(now.at.timestamp())
            }
            _ => {}
        }
        grants.push(grant);
    }
    Ok(grants)
}

/// The tie-break key of a Polar event's snapshots: its type, grant and time as Polar wrote
/// them. Polar's payload carries no event id (the `webhook-id` header is the dedupe key, not
/// in the body the rules read), and two events of one grant at one microsecond are one.
pub fn event_key(event_type: &str, data: &Value) -> String {
    let at = text(data, "/modified_at")
        .or(text(data, "/created_at"))
        .unwrap_or_default();
    let grant = text(data, "/id").unwrap_or_default();
    format!("{event_type}:{grant}:{at}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const GRANT: &str = "4a7c1e93-2d58-4f0b-b6e1-8c3d9a2f5e71";

    /// A meter credit grant's event: `properties` and `previous_properties` as Polar stores
    /// them (`BenefitGrantMeterCreditProperties`).
    fn event(
        rollover: bool,
        modified_at: &str,
        now: Option<(&str, i64)>,
        before: Option<(&str, i64)>,
    ) -> Value {
        let props = |c: Option<(&str, i64)>| match c {
            Some((at, units)) => json!({
                "last_credited_meter_id": "7d3a9e62-c1f4-4b8d-95a0-3e6b2f8c1d94",
                "last_credited_units": units, "last_credited_at": at}),
            None => json!({}),
        };
        json!({
            "id": GRANT, "created_at": "2026-01-01T10:00:00.100000Z", "modified_at": modified_at,
            "benefit": {"type": "meter_credit", "metadata": {},
                        "properties": {"units": 1000, "rollover": rollover,
                                       "meter_id": "7d3a9e62-c1f4-4b8d-95a0-3e6b2f8c1d94"}},
            "properties": props(now), "previous_properties": props(before)
        })
    }

    fn secs(at: &str) -> i64 {
        DateTime::parse_from_rfc3339(at).unwrap().timestamp()
    }

    const T1: &str = "2026-01-01T10:00:00.320114+00:00";
    const T2: &str = "2026-02-01T10:00:01.004511+00:00";

    #[test]
    fn a_grant_credits_its_units_from_the_crediting_time() {
        let e = event(false, T1, Some((T1, 1000)), None);
        let [g] = meter_credit_grants("benefit_grant.created", &e, "k")
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(
            g.grant_id,
            format!("meter_credit:{GRANT}:2026-01-01T10:00:00.320114Z")
        );
        assert_eq!(g.origin, Origin::PolarMeterCredit);
        assert_eq!(
            (g.unit.as_str(), g.amount),
            ("credits", Quantity::whole(1000))
        );
        assert_eq!(g.effective_at, Some(secs(T1)));
        assert_eq!((g.expires_at, g.voided_at), (None, None));
    }

    #[test]
    fn a_cycle_without_rollover_ends_the_crediting_before_it_and_with_rollover_does_not() {
        let e = event(false, T2, Some((T2, 1000)), Some((T1, 1000)));
        let grants = meter_credit_grants("benefit_grant.cycled", &e, "k").unwrap();
        assert_eq!(grants.len(), 2);
        assert_eq!(grants[0].expires_at, None, "the new crediting runs on");
        assert_eq!(
            grants[1].grant_id,
            grant_id(GRANT, DateTime::parse_from_rfc3339(T1).unwrap().into())
        );
        assert_eq!(grants[1].expires_at, Some(secs(T2)), "the meter was reset");
        let rolled = event(true, T2, Some((T2, 1000)), Some((T1, 1000)));
        let grants = meter_credit_grants("benefit_grant.cycled", &rolled, "k").unwrap();
        assert_eq!(grants[1].expires_at, None, "rollover keeps what remains");
        // An update credits again but resets nothing (`grant(update=True)`).
        let updated = meter_credit_grants("benefit_grant.updated", &e, "k").unwrap();
        assert_eq!(updated[1].expires_at, None);
    }

    #[test]
    fn a_revocation_that_took_the_crediting_back_voids_it_and_one_that_did_not_leaves_it() {
        let taken = "2026-01-20T09:00:00.5+00:00";
        let e = event(false, taken, Some((taken, -1000)), Some((T1, 1000)));
        let [g] = meter_credit_grants("benefit_grant.revoked", &e, "k")
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(g.effective_at, Some(secs(T1)));
        assert_eq!(g.voided_at, Some(secs(taken)));
        // Another grant of the benefit still held it: Polar left the properties as they were.
        let kept = event(false, taken, Some((T1, 1000)), Some((T1, 1000)));
        let [g] = meter_credit_grants("benefit_grant.revoked", &kept, "k")
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(g.voided_at, None);
        // Granted again after a revocation: the negative crediting before it is no grant.
        let again = event(false, T2, Some((T2, 1000)), Some((taken, -1000)));
        let grants = meter_credit_grants("benefit_grant.created", &again, "k").unwrap();
        assert_eq!(grants.len(), 1);
    }

    #[test]
    fn the_unit_is_the_benefits_metadata_unit_and_other_benefits_give_no_grant() {
        let mut e = event(false, T1, Some((T1, 1000)), None);
        e["benefit"]["metadata"] = json!({"unit": "api_calls"});
        let grants = meter_credit_grants("benefit_grant.created", &e, "k").unwrap();
        assert_eq!(grants[0].unit, "api_calls");
        e["benefit"]["metadata"] = json!({"unit": 3});
        assert!(meter_credit_grants("benefit_grant.created", &e, "k").is_err());
        e["benefit"]["type"] = json!("feature_flag");
        assert!(meter_credit_grants("benefit_grant.created", &e, "k")
            .unwrap()
            .is_empty());
        let never = event(false, T1, None, None);
        assert!(meter_credit_grants("benefit_grant.created", &never, "k")
            .unwrap()
            .is_empty());
    }
}
