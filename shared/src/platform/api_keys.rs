//! The app API's keys (docs/design.md §12.2): `INBOX_API_KEYS` lists each key by name, the
//! SHA-256 of its bytes and its scopes, so neither the environment nor a secret ever holds a
//! key itself. A presented key is hashed and compared with every entry in constant time.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Read accounts and their usage.
    Read,
    /// Record usage (debit the allowance).
    Usage,
    /// Replay one of an account's own events (`POST …/events/{event_id}/replay`).
    Replay,
    /// The admin API and the console: every account, event and effect, and acting on them.
    /// Never granted with the others by default (docs/design.md §12.2).
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Usage => "usage",
            Scope::Replay => "replay",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(raw: &str) -> Option<Scope> {
        match raw {
            "read" => Some(Scope::Read),
            "usage" => Some(Scope::Usage),
            "replay" => Some(Scope::Replay),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }
}

/// One entry of `INBOX_API_KEYS`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub name: String,
    /// Lowercase hex SHA-256 of the key's bytes.
    pub sha256: String,
    pub scopes: Vec<Scope>,
}

/// What `INBOX_API_KEYS` holds: the list itself, or the Secrets Manager secret holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeysConfig {
    Listed(Vec<KeyEntry>),
    InSecret { secret_id: String },
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawKeys {
    Listed(Vec<KeyEntry>),
    InSecret(SecretRef),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretRef {
    secret_id: String,
}

/// Why a list of keys is not valid: where, and what is wrong (never a key's value: the list
/// holds none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysError {
    pub field: Option<String>,
    pub detail: String,
}

impl KeysError {
    fn at(field: String, detail: impl Into<String>) -> Self {
        Self {
            field: Some(field),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for KeysError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{field}: {}", self.detail),
            None => f.write_str(&self.detail),
        }
    }
}

const SHAPE: &str = r#"a JSON list of {"name", "sha256", "scopes"} or {"secret_id": "…"}"#;

/// Parses `INBOX_API_KEYS`: the list, or (with `secret_allowed`) the secret holding it.
pub fn parse(raw: &str, secret_allowed: bool) -> Result<KeysConfig, KeysError> {
    let parsed: RawKeys = serde_json::from_str(raw).map_err(|e| KeysError {
        field: None,
        detail: format!("is not {SHAPE} (line {}, column {})", e.line(), e.column()),
    })?;
    match parsed {
        RawKeys::Listed(entries) => Ok(KeysConfig::Listed(check(entries)?)),
        RawKeys::InSecret(SecretRef { secret_id }) if secret_allowed => {
            if secret_id.trim().is_empty() {
                return Err(KeysError::at("secret_id".into(), "is empty"));
            }
            Ok(KeysConfig::InSecret { secret_id })
        }
        RawKeys::InSecret(_) => Err(KeysError {
            field: None,
            detail: "a secret holds the list itself, not another secret_id".into(),
        }),
    }
}

/// Parses what a keys secret holds: the list itself.
pub fn parse_list(raw: &str) -> Result<Vec<KeyEntry>, KeysError> {
    match parse(raw, false)? {
        KeysConfig::Listed(entries) => Ok(entries),
        KeysConfig::InSecret { .. } => Err(KeysError {
            field: None,
            detail: "a secret holds the list itself, not another secret_id".into(),
        }),
    }
}

/// Each entry has a name of its own, a well-formed hash that no other entry has, and at
/// least one scope.
fn check(entries: Vec<KeyEntry>) -> Result<Vec<KeyEntry>, KeysError> {
    if entries.is_empty() {
        return Err(KeysError {
            field: None,
            detail: "lists no key".into(),
        });
    }
    let mut names = std::collections::HashSet::new();
    let mut hashes = std::collections::HashSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let at = |what: &str| format!("[{i}] ({}): {what}", entry.name);
        if entry.name.trim().is_empty() {
            return Err(KeysError::at(format!("[{i}]: name"), "is empty"));
        }
        if !names.insert(entry.name.as_str()) {
            return Err(KeysError::at(at("name"), "is listed twice"));
        }
        let well_formed = entry.sha256.len() == 64
            && entry
                .sha256
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            return Err(KeysError::at(
                at("sha256"),
                "is not 64 lowercase hex digits (the SHA-256 of the key's bytes)",
            ));
        }
        if !hashes.insert(entry.sha256.as_str()) {
            return Err(KeysError::at(
                at("sha256"),
                "is another entry's key as well",
            ));
        }
        if entry.scopes.is_empty() {
            return Err(KeysError::at(at("scopes"), "is empty"));
        }
    }
    Ok(entries)
}

/// The lowercase hex SHA-256 of a key's bytes: what `INBOX_API_KEYS` lists.
pub fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A new key: `bik_` and the hex of 32 bytes from the operating system's random source. It
/// is shown once; only its hash ([`hash`]) is kept.
pub fn generate() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("bik_{}", hex::encode(bytes)))
}

/// A caller the keys let in: the key's name and scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub scopes: Vec<Scope>,
}

impl Caller {
    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }
}

/// The keys a function checks callers against: each entry's hash, decoded once.
#[derive(Clone)]
pub struct Keys {
    entries: Vec<([u8; 32], Caller)>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|(_, c)| c.name.as_str()).collect();
        f.debug_struct("Keys").field("names", &names).finish()
    }
}

impl Keys {
    /// The entries of a checked list (see [`parse`]).
    pub fn new(entries: &[KeyEntry]) -> Self {
        let entries = entries
            .iter()
            .filter_map(|entry| {
                let digest: [u8; 32] = hex::decode(&entry.sha256).ok()?.try_into().ok()?;
                let caller = Caller {
                    name: entry.name.clone(),
                    scopes: entry.scopes.clone(),
                };
                Some((digest, caller))
            })
            .collect();
        Self { entries }
    }

    /// The caller a presented key belongs to. Every entry is compared, in constant time, so
    /// the time taken says nothing of which entry (or how much of a hash) matched.
    pub fn check(&self, presented: &str) -> Option<&Caller> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for (hash, caller) in &self.entries {
            if bool::from(hash.ct_eq(&digest)) {
                found = Some(caller);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, key: &str, scopes: &[Scope]) -> KeyEntry {
        KeyEntry {
            name: name.into(),
            sha256: hash(key),
            scopes: scopes.to_vec(),
        }
    }

    #[test]
    fn a_listed_key_lets_its_caller_in_with_its_scopes_and_another_does_not() {
        let keys = Keys::new(&[
            entry("reader", "key-one", &[Scope::Read]),
            entry("app", "key-two", &[Scope::Read, Scope::Usage]),
        ]);
        let reader = keys.check("key-one").unwrap();
        assert_eq!(reader.name, "reader");
        assert!(reader.may(Scope::Read) && !reader.may(Scope::Usage));
        assert!(keys.check("key-two").unwrap().may(Scope::Usage));
        assert_eq!(keys.check("key-three"), None);
        assert_eq!(keys.check(""), None);
    }

    #[test]
    fn the_list_or_a_secret_id_parses_and_a_bad_entry_is_named() {
        let key = hash("k");
        let listed = format!(r#"[{{"name":"app","sha256":"{key}","scopes":["read","usage"]}}]"#);
        assert!(matches!(parse(&listed, true), Ok(KeysConfig::Listed(e)) if e.len() == 1));
        assert_eq!(
            parse(r#"{"secret_id":"arn:aws:secretsmanager:x"}"#, true),
            Ok(KeysConfig::InSecret {
                secret_id: "arn:aws:secretsmanager:x".into()
            })
        );
        assert!(parse(r#"{"secret_id":"x"}"#, false).is_err());
        let upper = listed.replace(&key, &key.to_uppercase());
        let error = parse(&upper, true).unwrap_err();
        assert_eq!(error.field.as_deref(), Some("[0] (app): sha256"));
        let twice = format!(
            r#"[{{"name":"a","sha256":"{key}","scopes":["read"]}},{{"name":"b","sha256":"{key}","scopes":["read"]}}]"#
        );
        assert!(parse(&twice, true)
            .unwrap_err()
            .detail
            .contains("another entry"));
        let bad_scope = listed.replace("usage", "owner");
        assert!(parse(&bad_scope, true).is_err());
        assert!(parse("[]", true).is_err());
        assert!(parse(r#"[{"name":"a","sha256":"00","scopes":[]}]"#, true).is_err());
    }

    #[test]
    fn a_new_key_is_long_random_and_visible_ascii() {
        let (a, b) = (generate().unwrap(), generate().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 68);
        assert!(a.starts_with("bik_") && a.bytes().all(|c| c.is_ascii_graphic()));
    }

    #[test]
    fn the_hash_is_lowercase_hex_sha256_of_the_key_bytes() {
        // SHA-256 of "abc", the FIPS 180-2 example.
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
