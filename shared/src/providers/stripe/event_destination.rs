//! Stripe's Amazon EventBridge event destination: the variables of the function that takes its
//! events from the partner event source (`functions/bridge`), and the source they are stored as.

use crate::platform::config::DatabaseConfig;
use crate::platform::config::{ConfigError, Env, FromEnv, SOURCES_VAR};

/// The variable naming the Stripe partner event source whose events the bridge takes.
pub const EVENT_SOURCE_VAR: &str = "INBOX_STRIPE_EVENT_SOURCE";
/// The variable naming the `INBOX_SOURCES` source those events are stored as.
pub const EVENT_SOURCE_FOR_VAR: &str = "INBOX_STRIPE_EVENT_SOURCE_FOR";
/// How every Stripe partner event source is named: `aws.partner/stripe.com/` and the
/// destination's own part (AWS's partner source names, docs/deploy.md).
pub const STRIPE_PARTNER_PREFIX: &str = "aws.partner/stripe.com/";

/// What the EventBridge function needs: the database and the queue as the intake's, the
/// partner event source it accepts, and the Stripe source its events are stored as. No
/// signing secret: the bus is the trust (docs/design.md §1.1).
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    pub database: DatabaseConfig,
    pub queue_url: String,
    /// The only EventBridge `source` taken, `aws.partner/stripe.com/…`.
    pub event_source: String,
    /// The `INBOX_SOURCES` source (of kind `stripe`) its events are stored as: the same rows,
    /// keys and dedupe as that source's HTTPS deliveries.
    pub source: String,
}

impl FromEnv for BridgeConfig {
    fn read<F: Fn(&str) -> Option<String>>(env: &Env<F>) -> Result<Self, ConfigError> {
        let event_source = env.required(EVENT_SOURCE_VAR)?;
        let part = event_source
            .strip_prefix(STRIPE_PARTNER_PREFIX)
            .ok_or_else(|| {
                ConfigError::new(
                    EVENT_SOURCE_VAR,
                    format!("is not a Stripe partner event source ({STRIPE_PARTNER_PREFIX}…)"),
                )
            })?;
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._-/".contains(c);
        if part.is_empty() || !part.chars().all(allowed) || event_source.len() > 256 {
            return Err(ConfigError::new(
                EVENT_SOURCE_VAR,
                "is not an event source name (letters, digits, '.', '-', '_', '/'; 256 at most)",
            ));
        }
        let source = env.required(EVENT_SOURCE_FOR_VAR)?;
        // Refused here, at cold start: events stored under a source the worker does not
        // know, or reads as another provider's, would all end unprocessable.
        match env.sources()?.iter().find(|s| s.name == source) {
            Some(config) if config.kind == crate::domain::SourceKind::Stripe => {}
            Some(_) => {
                return Err(ConfigError::new(
                    EVENT_SOURCE_FOR_VAR,
                    format!("names '{source}', which is not a Stripe source in {SOURCES_VAR}"),
                ))
            }
            None => {
                return Err(ConfigError::new(
                    EVENT_SOURCE_FOR_VAR,
                    format!("names '{source}', which is not in {SOURCES_VAR}"),
                ))
            }
        }
        Ok(Self {
            database: env.database()?,
            queue_url: env.required("QUEUE_URL")?,
            event_source,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCES: &str = r#"[{"name":"stripe","kind":"stripe","secrets":["whsec_x"]},
        {"name":"polar","kind":"standard-webhooks","secrets":["p"],"secret_encoding":"raw","tolerance_secs":60},
        {"name":"kinde","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks"}]"#;

    #[test]
    fn the_bridge_takes_a_stripe_partner_source_for_a_stripe_source_and_refuses_the_rest() {
        let config = |event_source: &str, source: &str| {
            let vars = [
                ("DATABASE_URL", "postgres://x"),
                ("QUEUE_URL", "http://q"),
                ("INBOX_SOURCES", SOURCES),
                ("INBOX_STRIPE_EVENT_SOURCE", event_source),
                ("INBOX_STRIPE_EVENT_SOURCE_FOR", source),
            ];
            BridgeConfig::from_lookup(|var| {
                vars.iter()
                    .find(|(name, _)| *name == var)
                    .map(|(_, value)| value.to_string())
            })
        };
        let ok = config("aws.partner/stripe.com/ed_test_61Abc", "stripe").unwrap();
        assert_eq!(ok.event_source, "aws.partner/stripe.com/ed_test_61Abc");
        assert_eq!(ok.source, "stripe");
        for (event_source, source, said) in [
            (
                "aws.partner/other.com/x",
                "stripe",
                "not a Stripe partner event source",
            ),
            (
                "aws.partner/stripe.com/",
                "stripe",
                "not an event source name",
            ),
            (
                "aws.partner/stripe.com/a b",
                "stripe",
                "not an event source name",
            ),
            (
                "aws.partner/stripe.com/ed_1",
                "polar",
                "not a Stripe source",
            ),
            (
                "aws.partner/stripe.com/ed_1",
                "paypal",
                "not in INBOX_SOURCES",
            ),
        ] {
            let error = config(event_source, source).unwrap_err().to_string();
            assert!(error.contains(said), "{event_source} {source}: {error}");
        }
    }

    /// The intake learns which source the bus feeds through the providers, as the bridge's
    /// variable names it; unset, no source is bus-fed.
    #[test]
    fn the_intake_reads_the_bus_fed_source_through_the_provider_hook() {
        let set = |var: &str| (var == EVENT_SOURCE_FOR_VAR).then(|| "stripe".to_owned());
        assert_eq!(crate::providers::bus_fed(set), Some("stripe".to_owned()));
        assert_eq!(crate::providers::bus_fed(|_| None), None);
    }
}
