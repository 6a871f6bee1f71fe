//! The plan catalog (`INBOX_PLANS`): what a provider's plan key, price id or product id means
//! here — a plan name, its monthly allowance and the features it gives, and the credit pack a
//! paid price grants.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Deserializer};

use super::features::{self, Features};

/// A catalog entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    pub plan: String,
    pub monthly_allowance: i64,
    /// The features the plan gives (docs/design.md §4.12); none when the entry has none.
    #[serde(default, deserialize_with = "features_of_json")]
    pub features: Features,
}

/// A catalog entry's `features`: an object of flags, whole numbers and strings.
fn features_of_json<'de, D: Deserializer<'de>>(d: D) -> Result<Features, D::Error> {
    let object = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
    features::of_json_object(&object).map_err(serde::de::Error::custom)
}

/// What a catalog entry may say: a plan, a credit pack, or both.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    plan: Option<String>,
    monthly_allowance: Option<i64>,
    #[serde(default, deserialize_with = "features_of_json")]
    features: Features,
    credits: Option<CreditPack>,
    /// Per unit, the level below which the plan's account is told `billing.credits_low`.
    #[serde(default)]
    credits_low: BTreeMap<String, i64>,
}

/// The credits a paid price grants (docs/design.md §4.14): `{"amount": 1000, "unit":
/// "credits", "expires_after_days": 365, "priority": 10}`. A payment of the price is a grant
/// keyed by the payment; its refund voids what remains.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreditPack {
    /// Whole units of `unit`.
    pub amount: i64,
    /// The unit a debit names to spend it; the unit of the monthly allowance by default.
    #[serde(default = "default_unit")]
    pub unit: String,
    /// `None`: the pack never expires.
    pub expires_after_days: Option<u32>,
    /// 0 (spent first) to 100; `None`: the provider's default, 50.
    pub priority: Option<u8>,
}

fn default_unit() -> String {
    "credits".to_owned()
}

/// A plan key resolved against the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRef {
    pub key: String,
    pub plan: String,
    pub monthly_allowance: i64,
}

/// Why a catalog was refused, and under which key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogError {
    pub key: String,
    pub detail: String,
}

/// Provider key → plan, and provider key → the credit pack its payment grants.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    plans: HashMap<String, Plan>,
    packs: HashMap<String, CreditPack>,
    /// Plan name → unit → low level, joined over the entries that name the plan.
    credits_low: HashMap<String, BTreeMap<String, i64>>,
}

impl Catalog {
    pub fn parse(raw: &str) -> Result<Self, CatalogError> {
        let entries: HashMap<String, Entry> =
            serde_json::from_str(raw).map_err(|e| CatalogError {
                key: "(the whole value)".into(),
                detail: format!("not a valid plan catalog: {e}"),
            })?;
        let refuse = |key: &str, detail: &str| CatalogError {
            key: key.to_owned(),
            detail: detail.to_owned(),
        };
        let mut plans = HashMap::new();
        let mut packs = HashMap::new();
        let mut credits_low: HashMap<String, BTreeMap<String, i64>> = HashMap::new();
        for (key, entry) in entries {
            if !entry.credits_low.is_empty() {
                let Some(plan) = entry.plan.as_ref() else {
                    return Err(refuse(&key, "credits_low without a plan"));
                };
                if entry.credits_low.values().any(|level| *level <= 0) {
                    return Err(refuse(
                        &key,
                        "credits_low levels must be positive whole numbers",
                    ));
                }
                // Of two entries of one plan, the higher level: the join, whatever their order.
                let levels = credits_low.entry(plan.clone()).or_default();
                for (unit, level) in entry.credits_low {
                    let held = levels.entry(unit).or_insert(level);
                    *held = (*held).max(level);
                }
            }
            if let Some(pack) = entry.credits {
                if pack.amount <= 0 {
                    return Err(refuse(
                        &key,
                        "credits.amount must be a positive whole number",
                    ));
                }
                if pack.unit.trim().is_empty() {
                    return Err(refuse(&key, "credits.unit is empty"));
                }
                if pack.expires_after_days == Some(0) {
                    return Err(refuse(
                        &key,
                        "credits.expires_after_days must be at least 1",
                    ));
                }
                if pack.priority.is_some_and(|p| p > 100) {
                    return Err(refuse(&key, "credits.priority must be from 0 to 100"));
                }
                packs.insert(key.clone(), pack);
            }
            match (entry.plan, entry.monthly_allowance) {
                (Some(plan), Some(monthly_allowance)) => {
                    plans.insert(
                        key,
                        Plan {
                            plan,
                            monthly_allowance,
                            features: entry.features,
                        },
                    );
                }
                (Some(_), None) => return Err(refuse(&key, "monthly_allowance is missing")),
                (None, _) if packs.contains_key(&key) && entry.features.is_empty() => {
                    if entry.monthly_allowance.is_some() {
                        return Err(refuse(&key, "monthly_allowance without a plan"));
                    }
                }
                (None, _) => return Err(refuse(&key, "the entry names no plan and no credits")),
            }
        }
        if let Some((key, _)) = plans.iter().find(|(_, p)| p.monthly_allowance < 0) {
            return Err(refuse(key, "monthly_allowance must not be negative"));
        }
        if let Some((key, _)) = plans.iter().find(|(_, p)| p.plan.trim().is_empty()) {
            return Err(refuse(key, "plan name is empty"));
        }
        Ok(Self {
            plans,
            packs,
            credits_low,
        })
    }

    /// The credit pack a payment of `key` grants, if the catalog names one.
    pub fn pack(&self, key: &str) -> Option<&CreditPack> {
        self.packs.get(key)
    }

    /// Per unit, the level below which an account on `plan` is told `billing.credits_low`
    /// (docs/design.md §4.14); a unit not named is watched for depletion only. Not part of the
    /// fingerprint: it tells, it moves no balance.
    pub fn credits_low_of(&self, plan: &str) -> BTreeMap<String, i64> {
        self.credits_low.get(plan).cloned().unwrap_or_default()
    }

    /// A digest of every entry, whatever order they came in: what a value folded under this
    /// catalog keeps, so that it is not taken for the fold under another (docs/design.md
    /// §4.11).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut entries: Vec<(&String, &Plan)> = self.plans.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        let mut described = format!("{entries:?}");
        // A catalog without packs keeps the digest it had before packs existed, so that the
        // audit's points kept under it stay valid.
        if !self.packs.is_empty() {
            let mut packs: Vec<(&String, &CreditPack)> = self.packs.iter().collect();
            packs.sort_by(|a, b| a.0.cmp(b.0));
            described.push_str(&format!("{packs:?}"));
        }
        hex::encode(Sha256::digest(described))
    }

    pub fn get(&self, key: &str) -> Option<&Plan> {
        self.plans.get(key)
    }

    /// The allowance of a plan by its name (several keys may name one plan).
    pub fn allowance_of(&self, plan: &str) -> Option<i64> {
        self.plans
            .values()
            .filter(|p| p.plan == plan)
            .map(|p| p.monthly_allowance)
            .max()
    }

    /// The features of a plan by its name: the join of every entry that names it
    /// (docs/design.md §4.12), so their order in the catalog does not matter. A plan the
    /// catalog does not name (`free`, unless an entry names it) gives none.
    pub fn features_of(&self, plan: &str) -> Features {
        let mut out = Features::new();
        for entry in self.plans.values().filter(|p| p.plan == plan) {
            features::join(&mut out, &entry.features);
        }
        out
    }

    /// The first candidate key the catalog knows. `Err` names the first candidate when the
    /// event names keys but none is known; no key at all is no plan.
    pub fn resolve(&self, candidates: &[&str]) -> Result<Option<PlanRef>, String> {
        for key in candidates {
            if let Some(plan) = self.get(key) {
                return Ok(Some(PlanRef {
                    key: (*key).to_owned(),
                    plan: plan.plan.clone(),
                    monthly_allowance: plan.monthly_allowance,
                }));
            }
        }
        match candidates.first() {
            Some(key) => Err((*key).to_owned()),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The catalog's `pro` entry, resolved.
    pub(crate) fn pro() -> PlanRef {
        PlanRef {
            key: "pro".into(),
            plan: "pro".into(),
            monthly_allowance: 500,
        }
    }

    /// The catalog the unit tests decide against.
    pub(crate) fn catalog() -> Catalog {
        Catalog::parse(
            r#"{"free":{"plan":"free","monthly_allowance":10},
                "pro":{"plan":"pro","monthly_allowance":500},
                "price_pro":{"plan":"pro","monthly_allowance":500},
                "prod_team":{"plan":"team","monthly_allowance":2000}}"#,
        )
        .unwrap()
    }

    #[test]
    fn catalog_rejects_negative_allowance_and_missing_fields() {
        let negative = Catalog::parse(r#"{"x":{"plan":"x","monthly_allowance":-1}}"#).unwrap_err();
        assert_eq!(negative.key, "x");
        assert!(Catalog::parse(r#"{"x":{"plan":"x"}}"#).is_err());
    }

    #[test]
    fn a_plans_features_are_the_join_of_its_entries_and_bad_values_are_refused() {
        let c = Catalog::parse(
            r#"{"price_pro":{"plan":"pro","monthly_allowance":500,
                             "features":{"sso":true,"seats":20,"export":"csv"}},
                "price_pro_y":{"plan":"pro","monthly_allowance":500,"features":{"seats":25}},
                "free":{"plan":"free","monthly_allowance":10}}"#,
        )
        .unwrap();
        let pro = c.features_of("pro");
        assert_eq!(
            serde_json::to_value(&pro).unwrap(),
            serde_json::json!({"sso": true, "seats": 25, "export": "csv"})
        );
        assert!(c.features_of("free").is_empty());
        assert!(c.features_of("team").is_empty());
        let bad =
            Catalog::parse(r#"{"x":{"plan":"x","monthly_allowance":1,"features":{"seats":2.5}}}"#)
                .unwrap_err();
        assert!(
            bad.detail.contains("feature 'seats' is 2.5"),
            "{}",
            bad.detail
        );
    }

    #[test]
    fn resolve_takes_the_first_known_key() {
        let c = Catalog::parse(r#"{"price_pro":{"plan":"pro","monthly_allowance":500}}"#).unwrap();
        assert_eq!(
            c.resolve(&["price_x", "price_pro"]).unwrap().unwrap().plan,
            "pro"
        );
        assert_eq!(c.resolve(&["price_x"]), Err("price_x".to_owned()));
        assert_eq!(c.resolve(&[]), Ok(None));
    }

    #[test]
    fn a_price_may_grant_a_credit_pack_instead_of_or_besides_a_plan() {
        let c = Catalog::parse(
            r#"{"price_pack":{"credits":{"amount":1000,"unit":"credits","expires_after_days":365,"priority":10}},
                "price_pro":{"plan":"pro","monthly_allowance":500,"credits":{"amount":50}}}"#,
        )
        .unwrap();
        assert_eq!(
            c.pack("price_pack"),
            Some(&CreditPack {
                amount: 1000,
                unit: "credits".into(),
                expires_after_days: Some(365),
                priority: Some(10)
            })
        );
        assert!(c.get("price_pack").is_none(), "a pack alone is no plan");
        assert_eq!(c.pack("price_pro").unwrap().unit, "credits");
        assert_eq!(c.get("price_pro").unwrap().plan, "pro");
        for (bad, says) in [
            (r#"{"x":{"credits":{"amount":0}}}"#, "credits.amount"),
            (
                r#"{"x":{"credits":{"amount":5,"priority":101}}}"#,
                "credits.priority",
            ),
            (
                r#"{"x":{"credits":{"amount":5,"expires_after_days":0}}}"#,
                "expires_after_days",
            ),
            (
                r#"{"x":{"credits":{"amount":5},"monthly_allowance":5}}"#,
                "without a plan",
            ),
            (r#"{"x":{}}"#, "no plan and no credits"),
        ] {
            let e = Catalog::parse(bad).unwrap_err();
            assert!(e.detail.contains(says), "{bad}: {}", e.detail);
        }
        assert!(Catalog::parse(r#"{"x":{"credits":{"amount":5,"colour":"red"}}}"#).is_err());
    }

    #[test]
    fn a_plans_low_credit_levels_are_per_unit_and_joined_over_its_entries() {
        let c = Catalog::parse(
            r#"{"price_pro":{"plan":"pro","monthly_allowance":500,"credits_low":{"credits":100}},
                "price_pro_y":{"plan":"pro","monthly_allowance":500,
                               "credits_low":{"credits":150,"usd":2000}},
                "free":{"plan":"free","monthly_allowance":10}}"#,
        )
        .unwrap();
        assert_eq!(
            c.credits_low_of("pro"),
            [("credits".to_owned(), 150), ("usd".to_owned(), 2000)].into()
        );
        assert!(c.credits_low_of("free").is_empty());
        for (bad, says) in [
            (
                r#"{"x":{"credits":{"amount":5},"credits_low":{"credits":1}}}"#,
                "without a plan",
            ),
            (
                r#"{"x":{"plan":"x","monthly_allowance":1,"credits_low":{"credits":0}}}"#,
                "positive",
            ),
        ] {
            let e = Catalog::parse(bad).unwrap_err();
            assert!(e.detail.contains(says), "{bad}: {}", e.detail);
        }
    }

    #[test]
    fn a_catalog_without_packs_keeps_its_fingerprint() {
        let plans = r#"{"price_pro":{"plan":"pro","monthly_allowance":500}}"#;
        // The digest of the same entries as the catalog kept them before packs existed.
        let before = {
            use sha2::{Digest, Sha256};
            let plan = Plan {
                plan: "pro".into(),
                monthly_allowance: 500,
                features: Features::new(),
            };
            let key = "price_pro".to_string();
            hex::encode(Sha256::digest(format!("{:?}", vec![(&key, &plan)])))
        };
        assert_eq!(Catalog::parse(plans).unwrap().fingerprint(), before);
        let with_pack = r#"{"price_pro":{"plan":"pro","monthly_allowance":500},
                           "price_pack":{"credits":{"amount":5}}}"#;
        assert_ne!(Catalog::parse(with_pack).unwrap().fingerprint(), before);
    }
}
