//! Features (entitlements): what a customer may use, by key — `{"sso": true, "seats": 20,
//! "export": "csv"}` — and the one rule that joins two sources' values for a key
//! (docs/design.md §4.12). Pure values: the catalog gives a plan's, a provider's entitlement
//! registers give theirs, and the account has their join.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One feature's value: a flag, a whole number (a limit: seats, projects) or a string (a
/// tier: `"csv"`). Anything else (a fraction, `null`, a list, an object) is refused where it
/// is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FeatureValue {
    Flag(bool),
    Number(i64),
    Text(String),
}

impl FeatureValue {
    /// Reads a JSON value as a feature's value; `None` for anything that is not a boolean, a
    /// whole number or a string.
    pub fn of_json(value: &serde_json::Value) -> Option<Self> {
        match value {
            serde_json::Value::Bool(b) => Some(Self::Flag(*b)),
            serde_json::Value::Number(n) => n.as_i64().map(Self::Number),
            serde_json::Value::String(s) => Some(Self::Text(s.clone())),
            _ => None,
        }
    }

    /// Whether it allows its feature: anything but `false`.
    pub fn allows(&self) -> bool {
        !matches!(self, Self::Flag(false))
    }

    /// Where its kind stands in the join's order: a flag says least, a string names a tier, a
    /// number says how much.
    fn kind_rank(&self) -> u8 {
        match self {
            Self::Flag(_) => 0,
            Self::Text(_) => 1,
            Self::Number(_) => 2,
        }
    }
}

/// The join's order (docs/design.md §4.12): by kind (flag < string < number), then within a
/// kind (`false` < `true`, the smaller number first, strings byte by byte). A total order, so
/// the larger of two values is the same whichever came first.
impl Ord for FeatureValue {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Self::Flag(a), Self::Flag(b)) => a.cmp(b),
            (Self::Number(a), Self::Number(b)) => a.cmp(b),
            (Self::Text(a), Self::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
            _ => self.kind_rank().cmp(&other.kind_rank()),
        }
    }
}

impl PartialOrd for FeatureValue {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl std::fmt::Display for FeatureValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Flag(b) => write!(f, "{b}"),
            Self::Number(n) => write!(f, "{n}"),
            Self::Text(s) => write!(f, "\"{s}\""),
        }
    }
}

/// A set of features by key, in key order.
pub type Features = BTreeMap<String, FeatureValue>;

/// Joins `more` into `features`: a key either gives is kept, and where both give one, the
/// larger value ([`FeatureValue`]'s order). Commutative and associative, so the join of many
/// sources is the same in every order.
pub fn join(features: &mut Features, more: &Features) {
    for (key, value) in more {
        match features.get_mut(key) {
            Some(held) if *held >= *value => {}
            Some(held) => *held = value.clone(),
            None => {
                features.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Reads a JSON object as features, refusing any value [`FeatureValue::of_json`] does not
/// read and any blank key; the error names the key.
pub fn of_json_object(
    object: &serde_json::Map<String, serde_json::Value>,
) -> Result<Features, String> {
    object
        .iter()
        .map(|(key, value)| {
            check_key(key).map_err(|e| format!("feature key '{}': {e}", key.escape_debug()))?;
            FeatureValue::of_json(value)
                .map(|v| (key.clone(), v))
                .ok_or_else(|| {
                    format!("feature '{key}' is {value}: a boolean, a whole number or a string")
                })
        })
        .collect()
}

/// The longest feature key, in characters (Stripe's lookup keys are at most 80).
pub const MAX_KEY_CHARS: usize = 255;

/// Why a string is no feature key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadKey {
    #[error("a feature key is not empty or blank")]
    Blank,
    #[error("a feature key is at most {MAX_KEY_CHARS} characters")]
    TooLong,
    #[error("a feature key has no control characters")]
    Control,
}

/// What a feature key may be, wherever one is named (a catalog entry, the app's check): not
/// blank, at most [`MAX_KEY_CHARS`] characters, no control characters. So every key the
/// catalog gives is one the app can ask for.
pub fn check_key(key: &str) -> Result<(), BadKey> {
    if key.trim().is_empty() {
        Err(BadKey::Blank)
    } else if key.chars().count() > MAX_KEY_CHARS {
        Err(BadKey::TooLong)
    } else if key.chars().any(char::is_control) {
        Err(BadKey::Control)
    } else {
        Ok(())
    }
}

/// A changed feature: its key, and its value before and after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FeatureChange {
    pub key: String,
    pub from: FeatureValue,
    pub to: FeatureValue,
}

/// What moved between two sets of features: the keys added, removed and changed (each in key
/// order); all empty when nothing did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FeaturesDiff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<FeatureChange>,
}

impl FeaturesDiff {
    pub fn between(before: &Features, after: &Features) -> Self {
        let mut diff = Self::default();
        for (key, to) in after {
            match before.get(key) {
                None => diff.added.push(key.clone()),
                Some(from) if from != to => diff.changed.push(FeatureChange {
                    key: key.clone(),
                    from: from.clone(),
                    to: to.clone(),
                }),
                Some(_) => {}
            }
        }
        diff.removed = before
            .keys()
            .filter(|k| !after.contains_key(*k))
            .cloned()
            .collect();
        diff
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn features(value: serde_json::Value) -> Features {
        of_json_object(value.as_object().unwrap()).unwrap()
    }

    #[test]
    fn the_larger_value_wins_whatever_the_order() {
        let catalog = features(json!({"sso": false, "seats": 20, "export": "csv", "api": true}));
        let provider =
            features(json!({"sso": true, "seats": 5, "export": "parquet", "beta": true}));
        let want = features(json!({"sso": true, "seats": 20, "export": "parquet",
                                   "api": true, "beta": true}));
        let mut one = catalog.clone();
        join(&mut one, &provider);
        let mut other = provider.clone();
        join(&mut other, &catalog);
        assert_eq!(one, want);
        assert_eq!(other, want);
        // Across kinds: a number says more than a string, which says more than a flag.
        let mut mixed = features(json!({"seats": true, "tier": "gold"}));
        join(&mut mixed, &features(json!({"seats": 3, "tier": true})));
        assert_eq!(mixed, features(json!({"seats": 3, "tier": "gold"})));
    }

    #[test]
    fn values_are_flags_whole_numbers_or_strings() {
        assert!(of_json_object(json!({"x": 1.5}).as_object().unwrap()).is_err());
        assert!(of_json_object(json!({"x": null}).as_object().unwrap()).is_err());
        assert!(of_json_object(json!({"x": [1]}).as_object().unwrap()).is_err());
        assert!(of_json_object(json!({" ": true}).as_object().unwrap()).is_err());
        assert!(of_json_object(json!({"a\u{7}b": true}).as_object().unwrap()).is_err());
        let long = "k".repeat(MAX_KEY_CHARS + 1);
        assert!(of_json_object(json!({long: true}).as_object().unwrap()).is_err());
        assert!(!FeatureValue::Flag(false).allows());
        assert!(FeatureValue::Number(0).allows());
        assert_eq!(
            serde_json::to_value(features(json!({"a": true, "b": 2, "c": "x"}))).unwrap(),
            json!({"a": true, "b": 2, "c": "x"})
        );
    }

    #[test]
    fn a_key_is_not_blank_not_too_long_and_has_no_control_characters() {
        assert_eq!(check_key("sso"), Ok(()));
        assert_eq!(check_key("team seats/eu"), Ok(()));
        assert_eq!(check_key(&"é".repeat(MAX_KEY_CHARS)), Ok(()));
        assert_eq!(check_key(""), Err(BadKey::Blank));
        assert_eq!(check_key(" \t"), Err(BadKey::Blank));
        assert_eq!(
            check_key(&"k".repeat(MAX_KEY_CHARS + 1)),
            Err(BadKey::TooLong)
        );
        assert_eq!(check_key("a\u{0}b"), Err(BadKey::Control));
        assert_eq!(check_key("a\u{85}b"), Err(BadKey::Control));
    }

    #[test]
    fn the_diff_names_what_was_added_removed_and_changed() {
        let before = features(json!({"sso": true, "seats": 5, "old": true}));
        let after = features(json!({"sso": true, "seats": 20, "new": "x"}));
        let diff = FeaturesDiff::between(&before, &after);
        assert_eq!(diff.added, vec!["new".to_owned()]);
        assert_eq!(diff.removed, vec!["old".to_owned()]);
        assert_eq!(
            diff.changed,
            vec![FeatureChange {
                key: "seats".into(),
                from: FeatureValue::Number(5),
                to: FeatureValue::Number(20)
            }]
        );
        assert!(FeaturesDiff::between(&after, &after).is_empty());
    }
}
