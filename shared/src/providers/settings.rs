//! Each provider's rules for its sources' settings (`INBOX_SOURCES`): the settings only one
//! provider takes, and what a provider needs of its settings together. The configuration
//! (`platform::config`) holds the values and checks what every source shares; these are
//! checked once the sources are read, by every function and tool that reads them.

use super::provider;
use crate::domain::SourceKind;
use crate::platform::config::{ConfigError, SourceConfig, SOURCES_VAR};

/// A setting of `INBOX_SOURCES` that only one provider takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// `livemode`: the mode a source takes.
    Livemode,
    /// `api_client_id`: an OAuth client the API key is the secret of.
    ApiClientId,
}

impl Setting {
    fn name(self) -> &'static str {
        match self {
            Self::Livemode => "livemode",
            Self::ApiClientId => "api_client_id",
        }
    }

    fn given(self, config: &SourceConfig) -> bool {
        match self {
            Self::Livemode => config.livemode.is_some(),
            Self::ApiClientId => config.api_client_id.is_some(),
        }
    }
}

/// The error for `setting` of the source `config`.
pub fn refused(config: &SourceConfig, setting: &str, detail: &str) -> ConfigError {
    ConfigError::at(
        SOURCES_VAR,
        format!("source '{}': {setting}", config.name),
        detail,
    )
}

/// Checks every source against its provider's rules: a setting another provider owns is
/// refused with that provider's reason, then the source's own provider checks the rest.
pub fn check_sources(configs: &[SourceConfig]) -> Result<(), ConfigError> {
    for config in configs {
        for &kind in SourceKind::ALL.iter().filter(|&&k| k != config.kind) {
            for &(setting, why) in provider(kind).own_settings() {
                if setting.given(config) && !takes(config.kind, setting) {
                    return Err(refused(config, setting.name(), why));
                }
            }
        }
        provider(config.kind).check(config)?;
        check_meter(config)?;
        if let Some(setting) = &config.api_budget {
            let default = provider(config.kind).api_limit(config);
            crate::platform::budget::Limit::set(default, setting)
                .map_err(|why| refused(config, "api_budget", &why))?;
        }
    }
    Ok(())
}

/// Whether a provider takes a setting of its own (several may own one: `livemode`).
fn takes(kind: SourceKind, setting: Setting) -> bool {
    provider(kind)
        .own_settings()
        .iter()
        .any(|&(own, _)| own == setting)
}

/// A source's `meter` (docs/design.md §4.13): the one field its provider reads, within its
/// length, and an API key to send with.
fn check_meter(config: &SourceConfig) -> Result<(), ConfigError> {
    let Some(meter) = &config.meter else {
        return Ok(());
    };
    let Some((field, longest)) = provider(config.kind).meter_field() else {
        return Err(refused(
            config,
            "meter",
            "this provider's meters take no reports from billing-inbox",
        ));
    };
    for (name, value) in [
        ("event_name", &meter.event_name),
        ("feature_code", &meter.feature_code),
    ] {
        let at = format!("meter.{name}");
        match value {
            Some(_) if name != field => {
                return Err(refused(
                    config,
                    &at,
                    &format!("is not this provider's: its meter is named by meter.{field}"),
                ))
            }
            Some(v)
                if v.trim().is_empty() || v.len() > longest || v.chars().any(char::is_control) =>
            {
                return Err(refused(
                    config,
                    &at,
                    &format!("must be 1 to {longest} characters, without control characters"),
                ))
            }
            None if name == field => {
                return Err(refused(
                    config,
                    &at,
                    "is required: the meter's name at the provider",
                ))
            }
            _ => {}
        }
    }
    if config.api_key.is_none() && config.api_key_secret_id.is_none() {
        return Err(refused(
            config,
            "meter",
            "needs the source's API key (api_key_secret_id, or api_key locally): reports are \
             sent through the provider's API",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::config::parse_sources;

    fn checked(raw: &str) -> Result<(), String> {
        let sources = parse_sources(raw).map_err(|e| e.to_string())?;
        check_sources(&sources).map_err(|e| e.to_string())
    }

    #[test]
    fn a_kinde_api_key_needs_its_client_id_and_only_kinde_takes_one() {
        let error = checked(
            r#"[{"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_key":"s"}]"#,
        )
        .unwrap_err();
        assert!(
            error.starts_with("INBOX_SOURCES: source 'k': api_client_id: is required with api_key"),
            "{error}"
        );
        let error = checked(
            r#"[{"name":"s","kind":"stripe","secrets":["x"],"api_key":"sk","api_client_id":"c"}]"#,
        )
        .unwrap_err();
        assert_eq!(
            error,
            "INBOX_SOURCES: source 's': api_client_id: is a Kinde setting (the other providers' API keys are bearer tokens)"
        );
        checked(
            r#"[{"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_client_id":"m2m","api_key_secret_id":"billing-inbox/kinde-api-key"}]"#,
        )
        .unwrap();
    }

    #[test]
    fn a_kinde_source_keeps_its_api_key_in_a_secret_of_its_own() {
        let cases = [
            (
                r#"[{"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_key_secret_id":"b"}]"#,
                "INBOX_SOURCES: source 'k': api_client_id: is required with api_key or api_key_secret_id: Kinde's Management API takes an M2M application's client id and secret (the secret is the API key)",
            ),
            (
                r#"[{"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_client_id":"m2m","secret_id":"a","api_key_secret_id":"b"}]"#,
                "INBOX_SOURCES: source 'k': secret_id: a Kinde source has no signing secret (it verifies with jwks_url): its M2M client secret's secret is api_key_secret_id alone",
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(checked(raw).unwrap_err(), expected, "{raw}");
        }
    }

    #[test]
    fn a_meter_is_named_by_its_providers_field_and_needs_an_api_key() {
        checked(r#"[{"name":"s","kind":"stripe","secrets":["x"],"api_key":"sk","meter":{"event_name":"api_calls"}}]"#).unwrap();
        checked(r#"[{"name":"p","kind":"standard-webhooks","secrets":["x"],"api_key":"pk","meter":{"event_name":"api_calls"}}]"#).unwrap();
        checked(r#"[{"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_client_id":"m2m","api_key":"s","meter":{"feature_code":"api_calls"}}]"#).unwrap();
        let cases = [
            (
                r#"[{"name":"s","kind":"stripe","secrets":["x"],"meter":{"event_name":"api_calls"}}]"#,
                "INBOX_SOURCES: source 's': meter: needs the source's API key (api_key_secret_id, or api_key locally): reports are sent through the provider's API",
            ),
            (
                r#"[{"name":"s","kind":"stripe","secrets":["x"],"api_key":"sk","meter":{"feature_code":"api_calls"}}]"#,
                "INBOX_SOURCES: source 's': meter.event_name: is required: the meter's name at the provider",
            ),
            (
                r#"[{"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_client_id":"m2m","api_key":"s","meter":{"event_name":"api_calls"}}]"#,
                "INBOX_SOURCES: source 'k': meter.event_name: is not this provider's: its meter is named by meter.feature_code",
            ),
            (
                r#"[{"name":"s","kind":"stripe","secrets":["x"],"api_key":"sk","meter":{"event_name":" "}}]"#,
                "INBOX_SOURCES: source 's': meter.event_name: must be 1 to 100 characters, without control characters",
            ),
        ];
        for (raw, expected) in cases {
            assert_eq!(checked(raw).unwrap_err(), expected, "{raw}");
        }
        let unknown = checked(r#"[{"name":"s","kind":"stripe","secrets":["x"],"api_key":"sk","meter":{"event":"x"}}]"#).unwrap_err();
        assert!(unknown.contains("unknown field `event`"), "{unknown}");
    }

    /// Each function's verdict on the sources, as its start makes it: its configuration read
    /// from the same variables, then the providers' rules on the sources it holds.
    fn verdicts(sources: &str) -> Vec<(&'static str, Result<(), String>)> {
        use crate::platform::config::{
            ApiConfig, DispatcherConfig, FromEnv, IntakeConfig, SchedulerConfig, WorkerConfig,
        };
        let env = |reads: &'static str| {
            let sources = sources.to_owned();
            move |var: &str| {
                Some(match var {
                    "DATABASE_URL" => "postgres://x".to_owned(),
                    "QUEUE_URL" => "http://127.0.0.1:9/queue/events".to_owned(),
                    "EFFECTS_QUEUE_URL" => "http://127.0.0.1:9/queue/effects".to_owned(),
                    "INBOX_SOURCES" => sources.clone(),
                    "INBOX_PLANS" => r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#.to_owned(),
                    "INBOX_API_KEYS" => r#"[{"name":"app","sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["read","usage"]}]"#.to_owned(),
                    "INBOX_PROVIDER_READS" => reads.to_owned(),
                    _ => return None,
                })
            }
        };
        fn verdict<C>(
            config: Result<C, ConfigError>,
            sources: impl Fn(&C) -> &[SourceConfig],
        ) -> Result<(), String> {
            let config = config.map_err(|e| e.to_string())?;
            check_sources(sources(&config)).map_err(|e| e.to_string())
        }
        vec![
            (
                "intake",
                verdict(IntakeConfig::from_lookup(env("true")), |c| &c.sources),
            ),
            (
                "worker",
                verdict(WorkerConfig::from_lookup(env("true")), |c| &c.sources),
            ),
            (
                "worker without provider reads",
                verdict(WorkerConfig::from_lookup(env("false")), |c| &c.sources),
            ),
            (
                "scheduler",
                verdict(SchedulerConfig::from_lookup(env("true")), |c| &c.sources),
            ),
            (
                "dispatcher",
                verdict(DispatcherConfig::from_lookup(env("true")), |c| &c.sources),
            ),
            (
                "api",
                verdict(ApiConfig::from_lookup(env("true")), |c| &c.sources),
            ),
        ]
    }

    /// A rule on `INBOX_SOURCES` is one rule: every function checks the sources as written,
    /// whatever it keeps of them afterwards (the api keeps no key, a worker without provider
    /// reads keeps none either), so a source one function takes is taken by all.
    #[test]
    fn every_function_gives_the_same_verdict_on_the_same_sources() {
        let inline = r#"[{"name":"s","kind":"stripe","secrets":["x"],"api_key":"sk_test_x","meter":{"event_name":"api_calls"}}]"#;
        let deployed = r#"[{"name":"s","kind":"stripe","secret_id":"billing-inbox/s","api_key_secret_id":"billing-inbox/s-api-key","meter":{"event_name":"api_calls"}},
            {"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_client_id":"m2m","api_key_secret_id":"billing-inbox/k-api-key","meter":{"feature_code":"api_calls"}}]"#;
        for sources in [inline, deployed] {
            for (function, verdict) in verdicts(sources) {
                assert_eq!(verdict, Ok(()), "{function}: {sources}");
            }
        }
        let keyless =
            r#"[{"name":"s","kind":"stripe","secrets":["x"],"meter":{"event_name":"api_calls"}}]"#;
        let refused = "INBOX_SOURCES: source 's': meter: needs the source's API key (api_key_secret_id, or api_key locally): reports are sent through the provider's API";
        let kinde_inline = r#"[{"name":"k","kind":"kinde","jwks_url":"https://x.kinde.com/.well-known/jwks","api_key":"s","meter":{"feature_code":"api_calls"}}]"#;
        for (sources, expected) in [(keyless, refused), (kinde_inline, "INBOX_SOURCES: source 'k': api_client_id: is required with api_key or api_key_secret_id: Kinde's Management API takes an M2M application's client id and secret (the secret is the API key)")] {
            for (function, verdict) in verdicts(sources) {
                assert_eq!(verdict, Err(expected.to_owned()), "{function}: {sources}");
            }
        }
    }

    #[test]
    fn livemode_is_a_stripe_setting() {
        checked(r#"[{"name":"s","kind":"stripe","secrets":["x"],"livemode":true}]"#).unwrap();
        checked(r#"[{"name":"l","kind":"lemonsqueezy","secrets":["x"],"livemode":false}]"#)
            .unwrap();
        let polar =
            checked(r#"[{"name":"p","kind":"standard-webhooks","secrets":["x"],"livemode":true}]"#)
                .unwrap_err();
        assert_eq!(
            polar,
            "INBOX_SOURCES: source 'p': livemode: is a Stripe setting (Stripe events say which mode they are from)"
        );
    }
}
