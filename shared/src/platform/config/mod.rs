//! Configuration: every environment variable the functions and `inboxctl` read, parsed and
//! validated once at cold start (docs/design.md §5), as plain values, in parts: `env` (where
//! variables come from, and how a configuration is read from them), `sources`
//! (`INBOX_SOURCES`, `INBOX_PLANS`), `sinks` (`INBOX_EFFECTS`), `database` (where the database
//! is) and `functions` (what each function reads). It names no provider: what a setting means
//! to one provider, and the variables only one provider's features read, are that provider's
//! (`providers::check_sources`, the `Provider` hooks). One error type names the variable, and
//! the field within it, that is missing or malformed.

mod database;
mod env;
mod functions;
mod sinks;
mod sources;
#[cfg(test)]
mod tests;

pub use database::*;
pub use env::*;
pub use functions::*;
pub use sinks::*;
pub use sources::*;

use std::fmt;

/// A variable that is missing or malformed; the message names it, and the field within it.
#[derive(thiserror::Error, PartialEq, Eq)]
pub struct ConfigError {
    pub var: &'static str,
    /// Where in the variable's value, e.g. `source 'shop': secrets[0]`.
    pub field: Option<String>,
    pub detail: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{}: {field}: {}", self.var, self.detail),
            None => write!(f, "{}: {}", self.var, self.detail),
        }
    }
}

/// Shown as its message: a function that fails at start prints its error with `{:?}`.
impl fmt::Debug for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl ConfigError {
    pub fn new(var: &'static str, detail: impl Into<String>) -> Self {
        Self {
            var,
            field: None,
            detail: detail.into(),
        }
    }

    pub fn at(var: &'static str, field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            var,
            field: Some(field.into()),
            detail: detail.into(),
        }
    }

    /// An error in one source of `INBOX_SOURCES`.
    pub fn source(name: &str, detail: impl Into<String>) -> Self {
        Self::at(SOURCES_VAR, format!("source '{name}'"), detail)
    }
}

/// A JSON error without the value it quotes: a serde message can repeat the offending
/// string, which in `INBOX_SOURCES` may be a secret. Field names are kept (they are not).
pub(crate) fn value_free(error: &serde_json::Error, expected: &str) -> String {
    let message = error.to_string();
    let what = if message.starts_with("unknown field") || message.starts_with("missing field") {
        message
            .split(" at line")
            .next()
            .unwrap_or_default()
            .to_owned()
    } else {
        match error.classify() {
            serde_json::error::Category::Syntax => "malformed JSON".to_owned(),
            serde_json::error::Category::Eof => "the JSON ends early".to_owned(),
            _ => "a value has the wrong type".to_owned(),
        }
    };
    format!(
        "not {expected}: {what} (line {}, column {})",
        error.line(),
        error.column()
    )
}
