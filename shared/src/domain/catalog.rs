//! The plan catalog (`INBOX_PLANS`): what a provider's plan key, price id or product id means
//! here — a plan name, its monthly allowance and the features it gives.

use std::collections::HashMap;

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

/// Provider key → plan.
#[derive(Debug, Clone, Default)]
pub struct Catalog(HashMap<String, Plan>);

impl Catalog {
    pub fn parse(raw: &str) -> Result<Self, CatalogError> {
        let plans: HashMap<String, Plan> = serde_json::from_str(raw).map_err(|e| CatalogError {
            key: "(the whole value)".into(),
            detail: format!("not a valid plan catalog: {e}"),
        })?;
        let refuse = |key: &str, detail: &str| CatalogError {
            key: key.to_owned(),
            detail: detail.to_owned(),
        };
        if let Some((key, _)) = plans.iter().find(|(_, p)| p.monthly_allowance < 0) {
            return Err(refuse(key, "monthly_allowance must not be negative"));
        }
        if let Some((key, _)) = plans.iter().find(|(_, p)| p.plan.trim().is_empty()) {
            return Err(refuse(key, "plan name is empty"));
        }
        Ok(Self(plans))
    }

    /// A digest of every entry, whatever order they came in: what a value folded under this
    /// catalog keeps, so that it is not taken for the fold under another (docs/design.md
    /// §4.11).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut entries: Vec<(&String, &Plan)> = self.0.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        hex::encode(Sha256::digest(format!("{entries:?}")))
    }

    pub fn get(&self, key: &str) -> Option<&Plan> {
        self.0.get(key)
    }

    /// The allowance of a plan by its name (several keys may name one plan).
    pub fn allowance_of(&self, plan: &str) -> Option<i64> {
        self.0
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
        for entry in self.0.values().filter(|p| p.plan == plan) {
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
}
