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

/// A private key in a file, and the `kid` its JWKS names it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFile {
    pub path: PathBuf,
    pub kid: String,
}

/// Parses `INBOX_ENGINE_ROOM` against the sources: each name a source of `INBOX_SOURCES`,
/// once, none of them live-mode (a Stripe source's `livemode: true`). What a source needs to
/// be signed for (a Kinde source's key) is checked where the Engine Room is built.
pub(crate) fn parse_engine_room(
    raw: &str,
    sources: &[SourceConfig],
) -> Result<(Vec<SourceConfig>, Option<KeyFile>), ConfigError> {
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
    Ok((chosen, kinde_key))
}
