//! `INBOX_ENGINE_ROOM`, the Engine Room's settings, read against the sources.

use std::path::PathBuf;

use serde::Deserialize;

use crate::platform::config::{
    value_free, ConfigError, SourceConfig, ENGINE_ROOM_VAR, SOURCES_VAR,
};

/// `INBOX_ENGINE_ROOM` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineRoomSettings {
    sources: Vec<String>,
    #[serde(default)]
    kinde_key_file: Option<PathBuf>,
    #[serde(default)]
    kinde_kid: Option<String>,
}

/// The Engine Room's settings, read against the sources.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The sources `INBOX_ENGINE_ROOM` names, as `INBOX_SOURCES` gives them, signing secrets
    /// (or their `secret_id`) kept: the Engine Room signs its deliveries with them, and the
    /// intake it runs verifies them with them. Never a live-mode source.
    pub sources: Vec<SourceConfig>,
    /// For a source whose provider signs with a private key of its own (Kinde): the PEM key
    /// whose public half the source's `jwks_url` serves (the dev stack's
    /// `INBOX_DEV_KINDE_KEY`), and the `kid` it names.
    pub kinde_key: Option<KeyFile>,
}

/// A private key in a file, and the `kid` its JWKS names it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFile {
    pub path: PathBuf,
    pub kid: String,
}

/// Parses `INBOX_ENGINE_ROOM` against the sources: each name a source of `INBOX_SOURCES`,
/// once, none of them live-mode (`livemode: true`). What a source needs to
/// be signed for (a Kinde source's key) is checked where the Engine Room is built.
pub fn parse(raw: &str, sources: &[SourceConfig]) -> Result<Settings, ConfigError> {
    let settings: EngineRoomSettings = serde_json::from_str(raw).map_err(|e| {
        ConfigError::new(
            ENGINE_ROOM_VAR,
            value_free(&e, r#"{"sources": [the names of test-mode sources]}"#),
        )
    })?;
    if settings.sources.is_empty() {
        return Err(ConfigError::at(
            ENGINE_ROOM_VAR,
            "sources",
            "lists no source (leave INBOX_ENGINE_ROOM unset to keep the Engine Room off)",
        ));
    }
    let mut chosen: Vec<SourceConfig> = Vec::new();
    for name in &settings.sources {
        let name = name.trim();
        let Some(source) = sources.iter().find(|s| s.name == name) else {
            let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
            return Err(ConfigError::at(
                ENGINE_ROOM_VAR,
                "sources",
                format!(
                    "'{name}' is not a source of {SOURCES_VAR} (its sources: {})",
                    names.join(", ")
                ),
            ));
        };
        if chosen.iter().any(|s| s.name == name) {
            return Err(ConfigError::at(
                ENGINE_ROOM_VAR,
                "sources",
                format!("'{name}' is named twice"),
            ));
        }
        if source.livemode == Some(true) {
            return Err(ConfigError::at(
                ENGINE_ROOM_VAR,
                "sources",
                format!(
                    "'{name}' is a live-mode source (livemode: true in {SOURCES_VAR}): the \
                     Engine Room runs only on test-mode sources"
                ),
            ));
        }
        chosen.push(source.clone());
    }
    let kinde_key = match (settings.kinde_key_file, settings.kinde_kid) {
        (None, None) => None,
        (Some(path), Some(kid)) if !kid.trim().is_empty() => Some(KeyFile {
            path,
            kid: kid.trim().to_owned(),
        }),
        _ => {
            return Err(ConfigError::at(
                ENGINE_ROOM_VAR,
                "kinde_key_file",
                "kinde_key_file and kinde_kid go together: the key's PEM file and the kid \
                 its JWKS names it by",
            ))
        }
    };
    Ok(Settings {
        sources: chosen,
        kinde_key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::config::parse_sources;

    /// The sources the Engine Room's settings are read against.
    fn sources() -> Vec<SourceConfig> {
        parse_sources(
            r#"[{"name":"kinde","kind":"kinde","jwks_url":"http://127.0.0.1:9/jwks"},
            {"name":"stripe","kind":"stripe","secrets":["whsec_test"],"livemode":false},
            {"name":"stripe-live","kind":"stripe","secrets":["whsec_live"],"livemode":true},
            {"name":"polar","kind":"standard-webhooks","secrets":["polar_secret"],"secret_encoding":"raw"}]"#,
        )
        .unwrap()
    }

    #[test]
    fn the_engine_room_keeps_only_its_test_sources_secrets_and_the_key_it_signs_with() {
        let room = parse(r#"{"sources":["stripe"," polar"]}"#, &sources()).unwrap();
        let names: Vec<&str> = room.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["stripe", "polar"]);
        assert_eq!(room.sources[0].secrets, ["whsec_test"]);
        assert_eq!(room.kinde_key, None);

        let kinde = parse(
            r#"{"sources":["kinde"],"kinde_key_file":"/k.pem","kinde_kid":"dev-key"}"#,
            &sources(),
        )
        .unwrap();
        assert_eq!(
            kinde.kinde_key,
            Some(KeyFile {
                path: "/k.pem".into(),
                kid: "dev-key".into()
            })
        );
    }

    #[test]
    fn an_engine_room_naming_a_live_unknown_or_repeated_source_is_refused() {
        for (raw, message) in [
            (
                r#"{"sources":["stripe-live"]}"#,
                "INBOX_ENGINE_ROOM: sources: 'stripe-live' is a live-mode source (livemode: true in INBOX_SOURCES): the Engine Room runs only on test-mode sources",
            ),
            (
                r#"{"sources":["paddle"]}"#,
                "INBOX_ENGINE_ROOM: sources: 'paddle' is not a source of INBOX_SOURCES (its sources: kinde, stripe, stripe-live, polar)",
            ),
            (
                r#"{"sources":["stripe","stripe"]}"#,
                "INBOX_ENGINE_ROOM: sources: 'stripe' is named twice",
            ),
            (
                r#"{"sources":[]}"#,
                "INBOX_ENGINE_ROOM: sources: lists no source (leave INBOX_ENGINE_ROOM unset to keep the Engine Room off)",
            ),
            (
                r#"{"sources":["kinde"],"kinde_key_file":"/k.pem"}"#,
                "INBOX_ENGINE_ROOM: kinde_key_file: kinde_key_file and kinde_kid go together: the key's PEM file and the kid its JWKS names it by",
            ),
            (
                r#"{"source":["stripe"]}"#,
                r#"INBOX_ENGINE_ROOM: not {"sources": [the names of test-mode sources]}: unknown field `source`, expected one of `sources`, `kinde_key_file`, `kinde_kid` (line 1, column 9)"#,
            ),
        ] {
            let refused = parse(raw, &sources()).unwrap_err();
            assert_eq!(refused.to_string(), message, "{raw}");
        }
    }
}
