//! Sources' secrets from AWS Secrets Manager (docs/design.md §5.3): a source names its secret
//! with `secret_id`, a JSON object `{"secrets": ["whsec_…"], "api_key": "…"}`, read once per
//! cold start. Each function takes only what it uses: the intake the signing secrets, the
//! scheduler and the worker the API key, which they read again on use, with a backoff, when
//! the cold start's read failed (`ApiKeyRead`). A webhook sink of effects names its signing
//! secret the same way (`{"secret": "whsec_…"}`, read by the dispatcher). Errors name the
//! source or sink and the field, never a value.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api_keys::{KeyEntry, KeysConfig};
use crate::config::{
    ConfigError, SinkConfig, SourceConfig, API_KEYS_VAR, EFFECTS_VAR, SOURCES_VAR,
};
use crate::signing::standard_webhooks::{decode_secret, SecretEncoding};

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

/// What a function does when a source's secret cannot be read at cold start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// It stops: it cannot work without the secret (the intake cannot verify).
    Stop,
    /// It goes on without the API key and reads the secret again when a provider read needs
    /// the key, no more often than the backoff allows; each failed read is logged and counted
    /// as `SecretReadFailures` by source and by this function's name.
    RetryOnUse(&'static str),
}

/// The wait after a failed read of a source's secret before a use tries it again; it doubles
/// with each failure in a row, up to `RETRY_MAX`.
pub const RETRY_FIRST: Duration = Duration::from_secs(5);
pub const RETRY_MAX: Duration = Duration::from_secs(300);
/// How long one read of a secret may take: a use waits on it.
const READ_BUDGET: Duration = Duration::from_secs(5);

/// A source's API key whose read at cold start failed: the first use after the backoff reads
/// the secret again; until one read succeeds, a use fails at once and says why.
pub struct ApiKeyRead {
    client: aws_sdk_secretsmanager::Client,
    source: String,
    secret_id: String,
    function: &'static str,
    failures: AtomicU32,
    state: tokio::sync::Mutex<ReadState>,
}

struct ReadState {
    key: Option<String>,
    next_try: Instant,
}

/// Never the key, not even through `{:?}`.
impl fmt::Debug for ApiKeyRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKeyRead")
            .field("source", &self.source)
            .field("secret_id", &self.secret_id)
            .field("function", &self.function)
            .field("failures", &self.failures())
            .finish()
    }
}

impl ApiKeyRead {
    /// The key of a source whose secret's read just failed with `error`: counted, and tried
    /// again after `RETRY_FIRST`.
    fn failed_at_start(
        client: aws_sdk_secretsmanager::Client,
        source: &SourceConfig,
        secret_id: &str,
        function: &'static str,
        error: &str,
    ) -> Self {
        let mut read = Self {
            client,
            source: source.name.clone(),
            secret_id: secret_id.to_owned(),
            function,
            failures: AtomicU32::new(0),
            state: tokio::sync::Mutex::new(ReadState {
                key: None,
                next_try: Instant::now(),
            }),
        };
        let next_try = read.count_failure(error);
        read.state.get_mut().next_try = next_try;
        read
    }

    /// Failed reads of the secret so far.
    pub fn failures(&self) -> u32 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The key: the one read, else a read of the secret when the backoff allows it, else an
    /// error saying when the next read is.
    pub async fn key(&self) -> anyhow::Result<String> {
        let mut state = self.state.lock().await;
        if let Some(key) = &state.key {
            return Ok(key.clone());
        }
        let now = Instant::now();
        if now < state.next_try {
            anyhow::bail!(
                "the API key of source '{}' is not read: its secret '{}' could not be read; next try in {} s",
                self.source,
                self.secret_id,
                (state.next_try - now).as_secs() + 1
            );
        }
        let read = tokio::time::timeout(
            READ_BUDGET,
            read(&self.client, &self.source, &self.secret_id),
        )
        .await;
        let error = match read {
            Ok(Ok(SourceSecret {
                api_key: Some(key), ..
            })) => {
                tracing::info!(source = %self.source, function = self.function,
                    failures = self.failures(), "a source's secret was read after failed reads; its API key is in use");
                state.key = Some(key.clone());
                return Ok(key);
            }
            Ok(Ok(_)) => format!("the secret '{}' holds no api_key", self.secret_id),
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!(
                "the secret '{}' was not read within {} s",
                self.secret_id,
                READ_BUDGET.as_secs()
            ),
        };
        state.next_try = self.count_failure(&error);
        anyhow::bail!(
            "the API key of source '{}' is not read: {error}",
            self.source
        )
    }

    /// Logs and counts one failed read (`error` names the secret, never a value); returns
    /// when the next read may be tried.
    fn count_failure(&self, error: &str) -> Instant {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let wait = RETRY_FIRST
            .saturating_mul(2u32.saturating_pow(failures - 1))
            .min(RETRY_MAX);
        tracing::error!(source = %self.source, function = self.function, failures,
            retry_in_secs = wait.as_secs(), error,
            "a source's secret could not be read; going on without its API key, read again on use");
        println!(
            "{}",
            secret_read_failure_metric(&self.source, self.function, Utc::now())
        );
        Instant::now() + wait
    }
}

/// The Embedded Metric Format line for one failed read of a source's secret:
/// `SecretReadFailures` by `Stack`, `Source` and `Function`.
pub fn secret_read_failure_metric(source: &str, function: &str, now: DateTime<Utc>) -> Value {
    let mut line = crate::metrics::document(
        now,
        &[&["Source", "Function"]],
        &[("SecretReadFailures", "Count")],
    );
    line["Source"] = json!(source);
    line["Function"] = json!(function);
    line["SecretReadFailures"] = json!(1);
    line
}

/// A provider API key as a source's reads use it.
#[derive(Clone)]
pub enum ApiKey {
    /// Inline, or read from the source's secret at cold start.
    Known(String),
    /// Read from the source's secret on use: the read at cold start failed.
    OnUse(Arc<ApiKeyRead>),
}

impl ApiKey {
    pub async fn get(&self) -> anyhow::Result<String> {
        match self {
            Self::Known(key) => Ok(key.clone()),
            Self::OnUse(read) => read.key().await,
        }
    }
}

impl From<&str> for ApiKey {
    fn from(key: &str) -> Self {
        Self::Known(key.to_owned())
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> Self {
        Self::Known(key)
    }
}

/// A Secrets Manager client configured like every AWS client here (`AWS_ENDPOINT_URL`
/// points it at the local server in development and tests).
pub async fn client() -> aws_sdk_secretsmanager::Client {
    aws_sdk_secretsmanager::Client::new(&crate::queue::sdk_config().await)
}

/// The sources with what their secrets hold filled in, as `needs` says; inline values win.
/// A secret that cannot be read or parsed is a configuration error naming the source. The
/// intake cannot verify without its secrets, so it stops (`OnFailure::Stop`); the scheduler
/// and the worker go on without that source's API key, and read the secret again when a read
/// needs the key (`OnFailure::RetryOnUse`, the source's `api_key_read`).
pub async fn resolve(
    sources: &[SourceConfig],
    needs: Needs,
    on_failure: OnFailure,
) -> Result<Vec<SourceConfig>, ConfigError> {
    let client = match sources.iter().any(|s| s.secret_id.is_some()) {
        true => Some(client().await),
        false => None,
    };
    let mut resolved = Vec::with_capacity(sources.len());
    for source in sources {
        let mut source = source.clone();
        if let (Some(id), Some(client)) = (source.secret_id.clone(), &client) {
            let secret = match (read(client, &source.name, &id).await, on_failure) {
                (Ok(secret), _) => secret,
                (Err(error), OnFailure::RetryOnUse(function))
                    if needs == Needs::ApiKey && source.api_key.is_none() =>
                {
                    let read = ApiKeyRead::failed_at_start(
                        client.clone(),
                        &source,
                        &id,
                        function,
                        &error.to_string(),
                    );
                    source.api_key_read = Some(Arc::new(read));
                    SourceSecret::default()
                }
                (Err(error), OnFailure::RetryOnUse(_)) => {
                    tracing::error!(error = %error, "a source's secret could not be read; going on without it");
                    SourceSecret::default()
                }
                (Err(error), OnFailure::Stop) => return Err(error),
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
            decode_secret(&secret.secret, SecretEncoding::Base64).map_err(|detail| {
                ConfigError::at(EFFECTS_VAR, field(), format!("the secret '{id}': {detail}"))
            })?;
            sink.secret = Some(secret.secret);
        }
        resolved.push(sink);
    }
    Ok(resolved)
}

/// A secret's text; the error says why not, without any value.
pub(crate) async fn read_text(
    client: &aws_sdk_secretsmanager::Client,
    id: &str,
) -> Result<String, String> {
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

/// The app API's keys (docs/design.md §12.2): the listed entries, or what the named secret
/// holds, read once at cold start. A secret that cannot be read or parsed is a
/// configuration error naming the secret, never a value.
pub async fn resolve_api_keys(keys: &KeysConfig) -> Result<Vec<KeyEntry>, ConfigError> {
    let secret_id = match keys {
        KeysConfig::Listed(entries) => return Ok(entries.clone()),
        KeysConfig::InSecret { secret_id } => secret_id,
    };
    let text = read_text(&client().await, secret_id)
        .await
        .map_err(|detail| ConfigError::at(API_KEYS_VAR, "secret_id", detail))?;
    crate::api_keys::parse_list(&text).map_err(|e| {
        ConfigError::at(
            API_KEYS_VAR,
            "secret_id",
            format!("the secret '{secret_id}': {e}"),
        )
    })
}
