//! The domain: values parsed once at the boundary and carried typed through the store, the
//! claim and the registers — dedupe keys, customer ids and the accounts they name, provider times and periods, source
//! kinds, event statuses and verdicts, content hashes, the verified event itself, the plan
//! catalog (`INBOX_PLANS`: what a provider's plan key means here), what an effect tells
//! the app ([`effect`]: its kind and id), and the retry policy of a failed attempt, an
//! event's and an effect's alike ([`retry`]). Nothing
//! here does I/O; every other layer depends on this one and it depends on none of them
//! (docs/design.md §2).

mod account;
pub(crate) mod catalog;
pub mod effect;
mod event;
pub mod features;
mod ids;
pub mod meter;
pub mod retry;
mod status;
mod time;

pub use account::{AccountError, AccountRef};
pub use catalog::{Catalog, CatalogError, Plan, PlanRef};
pub use event::{EventMeta, VerifiedEvent};
pub use features::{FeatureValue, Features, FeaturesDiff};
pub use ids::{ContentHash, CustomerId, DedupeKey};
pub use status::{EventStatus, SourceKind, Verdict};
pub use time::{Period, ProviderTime};

/// Longest identifier accepted from a provider; real ids are far shorter.
const MAX_ID_LEN: usize = 255;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DomainError {
    #[error("{0} is empty")]
    Empty(&'static str),
    #[error("{0} is longer than {MAX_ID_LEN} characters")]
    TooLong(&'static str),
    #[error("{0} contains control characters")]
    ControlCharacters(&'static str),
    #[error("{0} is not a valid time")]
    BadTime(&'static str),
    #[error("{0} must be YYYY-MM")]
    BadPeriod(String),
    #[error("'{0}' is not an event status")]
    UnknownStatus(String),
}

fn parse_id(what: &'static str, raw: &str) -> Result<String, DomainError> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err(DomainError::Empty(what));
    }
    if trimmed.len() > MAX_ID_LEN {
        return Err(DomainError::TooLong(what));
    }
    if trimmed.chars().any(char::is_control) {
        return Err(DomainError::ControlCharacters(what));
    }
    Ok(trimmed.to_owned())
}

/// Stores an enum as its text name in a `text` column, and reads it back through `FromStr`.
macro_rules! text_column {
    ($ty:ty) => {
        impl sqlx::Type<sqlx::Postgres> for $ty {
            fn type_info() -> sqlx::postgres::PgTypeInfo {
                <&str as sqlx::Type<sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
                <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
            }
        }

        impl<'r> sqlx::Decode<'r, sqlx::Postgres> for $ty {
            fn decode(
                value: sqlx::postgres::PgValueRef<'r>,
            ) -> Result<Self, sqlx::error::BoxDynError> {
                let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
                Ok(text.parse::<$ty>()?)
            }
        }

        impl sqlx::Encode<'_, sqlx::Postgres> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut sqlx::postgres::PgArgumentBuffer,
            ) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
                <&str as sqlx::Encode<sqlx::Postgres>>::encode(self.as_str(), buf)
            }
        }
    };
}
pub(crate) use text_column;
