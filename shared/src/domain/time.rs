//! Time as the providers tell it, and the billing period it falls in.

use std::fmt;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;

use super::DomainError;

/// The provider's own time for an event: the only order the billing model trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, sqlx::Type)]
#[sqlx(transparent)]
pub struct ProviderTime(DateTime<Utc>);

impl ProviderTime {
    pub fn from_unix_secs(secs: i64) -> Result<Self, DomainError> {
        Utc.timestamp_opt(secs, 0)
            .single()
            .map(Self)
            .ok_or(DomainError::BadTime("unix timestamp"))
    }

    pub fn parse_rfc3339(raw: &str) -> Result<Self, DomainError> {
        DateTime::parse_from_rfc3339(raw.trim())
            .map(|t| Self(t.with_timezone(&Utc)))
            .map_err(|_| DomainError::BadTime("RFC 3339 time"))
    }

    /// A JSON time as providers send them: RFC 3339 text or whole unix seconds.
    pub fn from_json(value: &Value) -> Result<Self, DomainError> {
        match value {
            Value::String(s) => Self::parse_rfc3339(s),
            Value::Number(n) => n
                .as_i64()
                .ok_or(DomainError::BadTime("unix timestamp"))
                .and_then(Self::from_unix_secs),
            _ => Err(DomainError::BadTime("JSON time")),
        }
    }

    pub fn as_datetime(&self) -> DateTime<Utc> {
        self.0
    }
}

impl From<DateTime<Utc>> for ProviderTime {
    fn from(t: DateTime<Utc>) -> Self {
        Self(t)
    }
}

/// A billing period: the UTC month of a provider time, `YYYY-MM`. Allowances are granted per
/// period (docs/design.md §4).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Period(String);

impl Period {
    /// The period a provider time falls in.
    pub fn of(at: ProviderTime) -> Self {
        Self(at.as_datetime().format("%Y-%m").to_string())
    }

    /// The current UTC month.
    pub fn current() -> Self {
        Self::of(ProviderTime::from(Utc::now()))
    }

    /// `YYYY-MM`, a real month.
    pub fn parse(raw: &str) -> Result<Self, DomainError> {
        let bad = || DomainError::BadPeriod(raw.to_owned());
        let (year, month) = raw.trim().split_once('-').ok_or_else(bad)?;
        let ok = year.len() == 4
            && month.len() == 2
            && year.bytes().all(|b| b.is_ascii_digit())
            && month.parse::<u32>().is_ok_and(|m| (1..=12).contains(&m));
        if !ok {
            return Err(bad());
        }
        Ok(Self(format!("{year}-{month}")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Period {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for ProviderTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.to_rfc3339())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn provider_time_reads_rfc3339_and_unix_seconds() {
        let a = ProviderTime::from_json(&json!("2026-01-01T00:00:00+02:00")).unwrap();
        let b = ProviderTime::from_json(&json!(1_767_218_400)).unwrap();
        assert_eq!(a, b);
        assert!(ProviderTime::from_json(&json!("yesterday")).is_err());
        assert!(ProviderTime::from_json(&json!(1.5)).is_err());
        assert!(ProviderTime::from_json(&json!(null)).is_err());
    }

    #[test]
    fn period_is_the_utc_month() {
        let t = ProviderTime::parse_rfc3339("2026-03-31T23:30:00-02:00").unwrap();
        assert_eq!(Period::of(t).as_str(), "2026-04");
    }

    #[test]
    fn period_must_be_a_real_month() {
        assert_eq!(Period::parse("2026-03").unwrap().as_str(), "2026-03");
        for bad in ["2026-13", "2026-3", "26-03", "march", "2026-00", ""] {
            assert!(Period::parse(bad).is_err(), "{bad}");
        }
    }
}
