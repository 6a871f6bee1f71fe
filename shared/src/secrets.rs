//! Sources' secrets from AWS Secrets Manager (docs/design.md §5.3): a source names its secret
//! with `secret_id`, a JSON object `{"secrets": ["whsec_…"], "api_key": "…"}`, read once per
//! cold start. Each function takes only what it uses: the intake the signing secrets, the
//! scheduler and the worker the API key. A webhook sink of effects names its signing secret
//! the same way (`{"secret": "whsec_…"}`, read by the dispatcher). Errors name the source or
//! sink and the field, never a value.

use serde::Deserialize;

use crate::config::{ConfigError, SinkConfig, SourceConfig, EFFECTS_VAR, SOURCES_VAR};

/// What a source's secret holds.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceSecret {
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    api_key: Option<String>,
}

/// Which parts of a secret a function takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// The signing secrets (the intake).
    Signing,
    /// The provider API key (the scheduler, the worker).
    ApiKey,
}

/// A Secrets Manager client configured like every AWS client here (`AWS_ENDPOINT_URL`
/// points it at the local server in development and tests).
pub async fn client() -> aws_sdk_secretsmanager::Client {
    aws_sdk_secretsmanager::Client::new(&crate::queue::sdk_config().await)
}

/// The sources with what their secrets hold filled in, as `needs` says; inline values win.
/// A secret that cannot be read or parsed is a configuration error naming the source. The
/// intake cannot verify without its secrets, so it stops; the scheduler and the worker go on
/// without that source's API key (`lenient`), and the log says why.
pub async fn resolve(
    sources: &[SourceConfig],
    needs: Needs,
    lenient: bool,
) -> Result<Vec<SourceConfig>, ConfigError> {
    let client = match sources.iter().any(|s| s.secret_id.is_some()) {
        true => Some(client().await),
        false => None,
    };
    let mut resolved = Vec::with_capacity(sources.len());
    for source in sources {
        let mut source = source.clone();
        if let (Some(id), Some(client)) = (source.secret_id.clone(), &client) {
            let secret = match read(client, &source.name, &id).await {
                Ok(secret) => secret,
                Err(error) if lenient => {
                    tracing::error!(error = %error, "a source's secret could not be read; going on without its API key");
                    SourceSecret::default()
                }
                Err(error) => return Err(error),
            };
            match needs {
                Needs::Signing if source.secrets.is_empty() => source.secrets = secret.secrets,
                Needs::ApiKey if source.api_key.is_none() => source.api_key = secret.api_key,
                _ => {}
            }
        }
        // What this function does not use does not stay in its memory.
        match needs {
            Needs::Signing => source.api_key = None,
            Needs::ApiKey => source.secrets.clear(),
        }
        resolved.push(source);
    }
    Ok(resolved)
}

async fn read(
    client: &aws_sdk_secretsmanager::Client,
    source: &str,
    id: &str,
) -> Result<SourceSecret, ConfigError> {
    let field = || format!("source '{source}': secret_id");
    let answer = client
        .get_secret_value()
        .secret_id(id)
        .send()
        .await
        .map_err(|e| {
            use aws_sdk_secretsmanager::error::ProvideErrorMetadata;
            let code = e.code().unwrap_or("no answer").to_owned();
            ConfigError::at(
                SOURCES_VAR,
                field(),
                format!("the secret '{id}' could not be read ({code})"),
            )
        })?;
    let text = answer.secret_string().ok_or_else(|| {
        ConfigError::at(
            SOURCES_VAR,
            field(),
            format!("the secret '{id}' holds no text"),
        )
    })?;
    serde_json::from_str(text).map_err(|e| {
        ConfigError::at(
            SOURCES_VAR,
            field(),
            format!(
                "the secret '{id}' is not {{\"secrets\": [...], \"api_key\": \"...\"}} (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })
}

/// What a webhook sink's secret holds: its signing secret.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SinkSecret {
    secret: String,
}

/// The sinks with each `secret_id` read into `secret` (the dispatcher, once per cold start).
/// A secret that cannot be read, parsed or decoded is a configuration error naming the sink,
/// never the value: the dispatcher cannot sign without it.
pub async fn resolve_sinks(sinks: &[SinkConfig]) -> Result<Vec<SinkConfig>, ConfigError> {
    let client = match sinks.iter().any(|s| s.secret_id.is_some()) {
        true => Some(client().await),
        false => None,
    };
    let mut resolved = Vec::with_capacity(sinks.len());
    for sink in sinks {
        let mut sink = sink.clone();
        if let (Some(id), Some(client), None) = (&sink.secret_id, &client, &sink.secret) {
            let field = || format!("sink '{}': secret_id", sink.name);
            let text = read_text(client, id)
                .await
                .map_err(|detail| ConfigError::at(EFFECTS_VAR, field(), detail))?;
            let secret: SinkSecret = serde_json::from_str(&text).map_err(|e| {
                ConfigError::at(
                    EFFECTS_VAR,
                    field(),
                    format!(
                        "the secret '{id}' is not {{\"secret\": \"whsec_...\"}} (line {}, column {})",
                        e.line(),
                        e.column()
                    ),
                )
            })?;
            crate::providers::standard_webhooks::decode_secret(
                &secret.secret,
                crate::config::SecretEncoding::Base64,
            )
            .map_err(|detail| {
                ConfigError::at(EFFECTS_VAR, field(), format!("the secret '{id}': {detail}"))
            })?;
            sink.secret = Some(secret.secret);
        }
        resolved.push(sink);
    }
    Ok(resolved)
}

/// A secret's text; the error says why not, without any value.
async fn read_text(client: &aws_sdk_secretsmanager::Client, id: &str) -> Result<String, String> {
    use aws_sdk_secretsmanager::error::ProvideErrorMetadata;
    let answer = client
        .get_secret_value()
        .secret_id(id)
        .send()
        .await
        .map_err(|e| {
            let code = e.code().unwrap_or("no answer");
            format!("the secret '{id}' could not be read ({code})")
        })?;
    answer
        .secret_string()
        .map(str::to_owned)
        .ok_or_else(|| format!("the secret '{id}' holds no text"))
}
