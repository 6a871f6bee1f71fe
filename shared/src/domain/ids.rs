//! Identifiers a provider gives us, and the hash that tells a copy from a conflict.

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{parse_id, DomainError};

/// The key that makes two deliveries the same event within one source.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, sqlx::Type)]
#[sqlx(transparent)]
pub struct DedupeKey(String);

impl DedupeKey {
    pub fn parse(raw: &str) -> Result<Self, DomainError> {
        parse_id("dedupe key", raw).map(Self)
    }

    /// For a signed body that names no id of its own: the same bytes are the same event.
    pub fn from_body(body: &[u8]) -> Self {
        Self(format!("sha256:{}", hex::encode(Sha256::digest(body))))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The provider's customer id (one customer per source).
#[derive(Debug, Clone, PartialEq, Eq, Hash, sqlx::Type)]
#[sqlx(transparent)]
pub struct CustomerId(String);

impl CustomerId {
    pub fn parse(raw: &str) -> Result<Self, DomainError> {
        parse_id("customer id", raw).map(Self)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// SHA-256 of an event's content without its delivery envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentHash([u8; 32]);

impl ContentHash {
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// Hash of the JSON value in canonical form (object keys sorted at every level), so
    /// that the same content hashes the same whatever the sender's key order or spacing.
    pub fn of_json(value: &Value) -> Self {
        let mut hasher = Sha256::new();
        write_canonical(value, &mut hasher);
        Self(hasher.finalize().into())
    }

    /// Hash of a JSON object without the fields that describe its delivery, not its content
    /// (they change between attempts of one event).
    pub fn of_json_without(value: &Value, envelope_fields: &[&str]) -> Self {
        let mut content = value.clone();
        if let Some(map) = content.as_object_mut() {
            for field in envelope_fields {
                map.remove(*field);
            }
        }
        Self::of_json(&content)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn write_canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            hasher.update(b"{");
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                write_canonical(&Value::String(key.clone()), hasher);
                hasher.update(b":");
                write_canonical(item, hasher);
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                write_canonical(item, hasher);
            }
            hasher.update(b"]");
        }
        // Scalars serialize the same whatever the map order, so serde_json's own form is canonical.
        scalar => hasher.update(scalar.to_string().as_bytes()),
    }
}

impl std::fmt::Display for DedupeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Display for CustomerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedupe_key_is_trimmed_and_must_not_be_empty() {
        assert_eq!(DedupeKey::parse("  evt_1 ").unwrap().as_str(), "evt_1");
        assert_eq!(
            DedupeKey::parse("  "),
            Err(DomainError::Empty("dedupe key"))
        );
        assert_eq!(
            DedupeKey::parse(&"x".repeat(256)),
            Err(DomainError::TooLong("dedupe key"))
        );
        assert_eq!(
            DedupeKey::parse("a\nb"),
            Err(DomainError::ControlCharacters("dedupe key"))
        );
    }

    #[test]
    fn body_dedupe_key_depends_only_on_the_bytes() {
        assert_eq!(DedupeKey::from_body(b"abc"), DedupeKey::from_body(b"abc"));
        assert_ne!(DedupeKey::from_body(b"abc"), DedupeKey::from_body(b"abd"));
        assert!(DedupeKey::from_body(b"abc").as_str().starts_with("sha256:"));
    }

    #[test]
    fn customer_id_rejects_empty() {
        assert!(CustomerId::parse("").is_err());
        assert_eq!(CustomerId::parse("cus_1").unwrap().as_str(), "cus_1");
    }

    #[test]
    fn content_hash_ignores_key_order_and_spacing() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":{"y":[1,2],"x":"s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{ "b": {"x": "s", "y": [1, 2]}, "a": 1 }"#).unwrap();
        assert_eq!(ContentHash::of_json(&a), ContentHash::of_json(&b));
        let c: Value = serde_json::from_str(r#"{"a":1,"b":{"y":[2,1],"x":"s"}}"#).unwrap();
        assert_ne!(ContentHash::of_json(&a), ContentHash::of_json(&c));
    }
}
