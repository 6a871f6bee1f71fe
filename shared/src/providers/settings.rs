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
                if setting.given(config) {
                    return Err(refused(config, setting.name(), why));
                }
            }
        }
        provider(config.kind).check(config)?;
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
    fn livemode_is_a_stripe_setting() {
        checked(r#"[{"name":"s","kind":"stripe","secrets":["x"],"livemode":true}]"#).unwrap();
        let polar =
            checked(r#"[{"name":"p","kind":"standard-webhooks","secrets":["x"],"livemode":true}]"#)
                .unwrap_err();
        assert_eq!(
            polar,
            "INBOX_SOURCES: source 'p': livemode: is a Stripe setting (Stripe events say which mode they are from)"
        );
    }
}
