//! The closed sets the pipeline speaks in: which kind of provider a source is, where an
//! event is in its life, and what a delivery turned out to be.

use std::str::FromStr;

use serde::Deserialize;

use super::{text_column, DomainError};

/// Declares [`SourceKind`] from one line per kind: the variant, and the name `INBOX_SOURCES`
/// uses for it. Adding a provider adds its line here and its registration in `providers`.
macro_rules! source_kinds {
    ($($kind:ident = $name:literal),+ $(,)?) => {
        /// How a source's deliveries are signed and read; each kind is one folder under
        /// `providers/`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
        pub enum SourceKind {
            $(#[serde(rename = $name)] $kind),+
        }

        impl SourceKind {
            pub const ALL: &'static [SourceKind] = &[$(Self::$kind),+];

            /// The name `INBOX_SOURCES` uses.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$kind => $name),+
                }
            }
        }
    };
}

source_kinds! {
    Kinde = "kinde",
    Stripe = "stripe",
    StandardWebhooks = "standard-webhooks",
    LemonSqueezy = "lemonsqueezy",
    Paddle = "paddle",
}

/// Where a stored event is in its life (docs/design.md §3):
/// `received → processing → applied | ignored`, `processing → failed → … → dead`, and
/// `unprocessable` for what can never be applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventStatus {
    Received,
    Processing,
    Applied,
    Ignored,
    Failed,
    Dead,
    Unprocessable,
}

impl EventStatus {
    pub const ALL: [EventStatus; 7] = [
        Self::Received,
        Self::Processing,
        Self::Applied,
        Self::Ignored,
        Self::Failed,
        Self::Dead,
        Self::Unprocessable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Processing => "processing",
            Self::Applied => "applied",
            Self::Ignored => "ignored",
            Self::Failed => "failed",
            Self::Dead => "dead",
            Self::Unprocessable => "unprocessable",
        }
    }

    /// Still waiting to be applied: a copy of it should wake a worker.
    pub fn is_pending(self) -> bool {
        matches!(self, Self::Received | Self::Processing | Self::Failed)
    }

    /// Done for good (until an operator replays it).
    pub fn is_final(self) -> bool {
        !self.is_pending()
    }

    /// Whether an event of this status has a row in `inbox_work` (docs/design.md §3.4): in
    /// flight or given up, not applied or ignored. The SQL function `inbox_stage` says the
    /// same.
    pub fn has_work_row(self) -> bool {
        !matches!(self, Self::Applied | Self::Ignored)
    }
}

impl FromStr for EventStatus {
    type Err = DomainError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == raw)
            .ok_or_else(|| DomainError::UnknownStatus(raw.to_owned()))
    }
}

impl std::fmt::Display for EventStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for EventStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

text_column!(EventStatus);

/// What a delivery turned out to be, relative to what was stored before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Stored,
    Duplicate,
    Conflict,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Duplicate => "duplicate",
            Self::Conflict => "conflict",
        }
    }
}

impl FromStr for Verdict {
    type Err = DomainError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        [Self::Stored, Self::Duplicate, Self::Conflict]
            .into_iter()
            .find(|v| v.as_str() == raw)
            .ok_or_else(|| DomainError::UnknownStatus(raw.to_owned()))
    }
}

text_column!(Verdict);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_their_names() {
        for status in EventStatus::ALL {
            assert_eq!(status.as_str().parse::<EventStatus>(), Ok(status));
        }
        assert!("done".parse::<EventStatus>().is_err());
        assert!(EventStatus::Failed.is_pending());
        assert!(EventStatus::Dead.is_final());
    }
}
