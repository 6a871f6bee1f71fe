//! Sources' secrets from AWS Secrets Manager (docs/design.md §5.3): a source names its signing
//! secrets' secret with `secret_id` (`{"secrets": ["whsec_…"]}`, read by the intake) and its
//! API key's with `api_key_secret_id` (`{"api_key": "…"}`, read by the scheduler and the
//! worker), each read once per cold start: two secrets, so that each function's role may read
//! only what that function uses. The scheduler and the worker read the key again on use, with
//! a backoff, when the cold start's read failed (`ApiKeyRead`). The combined layout of before
//! (an `api_key` inside the `secret_id` secret, no `api_key_secret_id`) still works where the
//! role may read it, with a warning at each cold start; a key in two places is refused. A
//! webhook sink of effects names its signing secret the same way (`{"secret": "whsec_…"}`,
//! read by the dispatcher). Errors name the source or sink and the field, never a value.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::platform::api_keys::{KeyEntry, KeysConfig};
use crate::platform::config::{
    value_free, ConfigError, SinkConfig, SourceConfig, API_KEYS_VAR, EFFECTS_VAR, SOURCES_VAR,
};
pub use crate::platform::provider_key::{ApiKey, ApiKeyOnUse};
use crate::signing::standard_webhooks::{decode_secret, SecretEncoding};

/// What a source's `secret_id` secret holds: its signing secrets. An `api_key` beside them is
/// the combined layout, still read (with a warning) by a function whose role may read it.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SigningSecret {
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default)]
    api_key: Option<String>,
}

/// What a source's `api_key_secret_id` secret holds: the API key alone (Kinde: the M2M
/// application's client secret).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeySecret {
    api_key: String,
}

/// Which secret a source's API key is read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyIn {
    /// `api_key_secret_id`: `{"api_key": "…"}`.
    OwnSecret,
    /// `secret_id`, the combined layout: `{"secrets": [...], "api_key": "…"}`.
    SigningSecret,
}

impl KeyIn {
    fn field(self) -> &'static str {
        match self {
            Self::OwnSecret => "api_key_secret_id",
            Self::SigningSecret => "secret_id",
        }
    }
}

/// A source's secret that could not be read or parsed: the error to report, and whether this
/// function's role was refused the read (`AccessDeniedException`).
struct Failed {
    error: ConfigError,
    denied: bool,
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
    key_in: KeyIn,
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
            .field(self.key_in.field(), &self.secret_id)
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
        key_in: KeyIn,
        function: &'static str,
        error: &str,
    ) -> Self {
        let mut read = Self {
            client,
            source: source.name.clone(),
            secret_id: secret_id.to_owned(),
            key_in,
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
            read_key(&self.client, &self.source, &self.secret_id, self.key_in),
        )
        .await;
        let error = match read {
            Ok(Ok(Some(key))) => {
                tracing::info!(source = %self.source, function = self.function,
                    failures = self.failures(), "a source's secret was read after failed reads; its API key is in use");
                if self.key_in == KeyIn::SigningSecret {
                    warn_combined(&self.source, &self.secret_id);
                }
                state.key = Some(key.clone());
                return Ok(key);
            }
            Ok(Ok(None)) => format!("the secret '{}' holds no api_key", self.secret_id),
            Ok(Err(failed)) => failed.error.to_string(),
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
        crate::platform::metrics::emit(secret_read_failure_metric(
            &self.source,
            self.function,
            Utc::now(),
        ));
        Instant::now() + wait
    }
}

impl ApiKeyOnUse for ApiKeyRead {
    fn key(&self) -> crate::BoxFuture<'_, anyhow::Result<String>> {
        Box::pin(ApiKeyRead::key(self))
    }

    fn failures(&self) -> u32 {
        ApiKeyRead::failures(self)
    }
}

/// The Embedded Metric Format line for one failed read of a source's secret:
/// `SecretReadFailures` by `Stack`, `Source` and `Function`.
pub fn secret_read_failure_metric(source: &str, function: &str, now: DateTime<Utc>) -> Value {
    let mut line = crate::platform::metrics::document(
        now,
        &[&["Source", "Function"]],
        &[("SecretReadFailures", "Count")],
    );
    line["Source"] = json!(source);
    line["Function"] = json!(function);
    line["SecretReadFailures"] = json!(1);
    line
}

/// A Secrets Manager client configured like every AWS client here (`AWS_ENDPOINT_URL`
/// points it at the local server in development and tests).
pub async fn client() -> aws_sdk_secretsmanager::Client {
    aws_sdk_secretsmanager::Client::new(&crate::platform::queue::sdk_config().await)
}

/// The sources with what their secrets hold filled in, as `needs` says; inline values win.
/// The intake (`Needs::Signing`) reads `secret_id` alone; the scheduler and the worker
/// (`Needs::ApiKey`) read `api_key_secret_id`, or, for a source of the combined layout (no
/// `api_key_secret_id`), `secret_id` for the `api_key` it may hold. A secret that cannot be
/// read or parsed is a configuration error naming the source and the field. The intake cannot
/// verify without its secrets, so it stops (`OnFailure::Stop`); the scheduler and the worker go
/// on without that source's API key, and read the secret again when a read needs the key
/// (`OnFailure::RetryOnUse`, the source's `api_key_read`). A key in two places is refused by
/// the function that finds it, whatever `on_failure` says: it is the configuration's error.
pub async fn resolve(
    sources: &[SourceConfig],
    needs: Needs,
    on_failure: OnFailure,
) -> Result<Vec<SourceConfig>, ConfigError> {
    let reads = |s: &SourceConfig| match needs {
        Needs::Signing => s.secret_id.is_some(),
        Needs::ApiKey => {
            s.api_key.is_none() && (s.api_key_secret_id.is_some() || s.secret_id.is_some())
        }
    };
    let client = match sources.iter().any(reads) {
        true => Some(client().await),
        false => None,
    };
    resolve_sources(client.as_ref(), sources, needs, on_failure).await
}

/// [`resolve`] with the given client (a test's, pointed at a server that refuses a read).
pub async fn resolve_with(
    client: &aws_sdk_secretsmanager::Client,
    sources: &[SourceConfig],
    needs: Needs,
    on_failure: OnFailure,
) -> Result<Vec<SourceConfig>, ConfigError> {
    resolve_sources(Some(client), sources, needs, on_failure).await
}

async fn resolve_sources(
    client: Option<&aws_sdk_secretsmanager::Client>,
    sources: &[SourceConfig],
    needs: Needs,
    on_failure: OnFailure,
) -> Result<Vec<SourceConfig>, ConfigError> {
    let mut resolved = Vec::with_capacity(sources.len());
    for source in sources {
        let mut source = source.clone();
        match (client, needs) {
            (Some(client), Needs::Signing) => take_signing(client, &mut source, on_failure).await?,
            (Some(client), Needs::ApiKey) => take_api_key(client, &mut source, on_failure).await?,
            (None, _) => {}
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

/// The intake's read: the signing secrets from `secret_id`. An `api_key` beside them is the
/// combined layout: dropped with a warning, or refused when the source has its key elsewhere.
async fn take_signing(
    client: &aws_sdk_secretsmanager::Client,
    source: &mut SourceConfig,
    on_failure: OnFailure,
) -> Result<(), ConfigError> {
    let Some(id) = source.secret_id.clone() else {
        return Ok(());
    };
    let secret = match (read_signing(client, &source.name, &id).await, on_failure) {
        (Ok(secret), _) => secret,
        (Err(failed), OnFailure::Stop) => return Err(failed.error),
        (Err(failed), OnFailure::RetryOnUse(_)) => {
            tracing::error!(error = %failed.error, "a source's secret could not be read; going on without it");
            return Ok(());
        }
    };
    if secret.api_key.is_some() {
        let elsewhere = match (&source.api_key, &source.api_key_secret_id) {
            (Some(_), _) => Some("inline (api_key)"),
            (None, Some(_)) => Some("in api_key_secret_id"),
            (None, None) => None,
        };
        if let Some(elsewhere) = elsewhere {
            return Err(ConfigError::at(
                SOURCES_VAR,
                format!("source '{}': secret_id", source.name),
                format!(
                    "the secret '{id}' holds an api_key, and the source has its API key \
                     {elsewhere} too: a key is kept in one place; remove api_key from the \
                     secret '{id}'"
                ),
            ));
        }
        warn_combined(&source.name, &id);
    }
    if source.secrets.is_empty() {
        source.secrets = secret.secrets;
    }
    Ok(())
}

/// The scheduler's and the worker's read: the API key, from `api_key_secret_id`, else (the
/// combined layout) from `secret_id`. Inline, it is not read at all.
async fn take_api_key(
    client: &aws_sdk_secretsmanager::Client,
    source: &mut SourceConfig,
    on_failure: OnFailure,
) -> Result<(), ConfigError> {
    if source.api_key.is_some() {
        return Ok(());
    }
    let (id, key_in) = match (&source.api_key_secret_id, &source.secret_id) {
        (Some(id), _) => (id.clone(), KeyIn::OwnSecret),
        (None, Some(id)) => (id.clone(), KeyIn::SigningSecret),
        (None, None) => return Ok(()),
    };
    match read_key(client, &source.name, &id, key_in).await {
        Ok(key) => {
            if key_in == KeyIn::SigningSecret && key.is_some() {
                warn_combined(&source.name, &id);
            }
            source.api_key = key;
        }
        // The split layout's roles: this function may not read the signing secrets, so a
        // source with no api_key_secret_id has no key here. Not a read to try again (it is
        // what the template grants), but said, since a key still in that secret (a stack
        // upgraded before its secrets were split) is then not used.
        Err(failed) if key_in == KeyIn::SigningSecret && failed.denied => {
            tracing::warn!(source = %source.name, secret_id = %id,
                "no API key: the source has no api_key_secret_id, and this function may not \
                 read its secret_id secret, so it makes no provider read for this source (no \
                 reconciliation; ties settled by the status rank). If that secret holds the \
                 API key, move the key to a secret of its own and name it with \
                 api_key_secret_id (docs/deploy.md)");
        }
        Err(failed) => match on_failure {
            OnFailure::Stop => return Err(failed.error),
            OnFailure::RetryOnUse(function) => {
                let read = ApiKeyRead::failed_at_start(
                    client.clone(),
                    source,
                    &id,
                    key_in,
                    function,
                    &failed.error.to_string(),
                );
                source.api_key_read = Some(Arc::new(read));
            }
        },
    }
    Ok(())
}

/// The one warning a source of the combined layout gets, from each function that reads it.
fn warn_combined(source: &str, secret_id: &str) {
    tracing::warn!(
        source,
        secret_id,
        "the source's secret_id secret also holds its API key (the combined layout): create a \
         secret of its own for the key, {{\"api_key\": \"...\"}}, name it with api_key_secret_id, \
         and remove api_key from this one, so that IAM can keep the key from the intake \
         (docs/deploy.md)"
    );
}

/// A source's API key from the secret `id`: `None` when a combined secret holds none.
async fn read_key(
    client: &aws_sdk_secretsmanager::Client,
    source: &str,
    id: &str,
    key_in: KeyIn,
) -> Result<Option<String>, Failed> {
    match key_in {
        KeyIn::OwnSecret => read_key_secret(client, source, id).await.map(Some),
        KeyIn::SigningSecret => Ok(read_signing(client, source, id).await?.api_key),
    }
}

/// The `secret_id` secret: `{"secrets": [...]}` (an `api_key` beside them: the combined layout).
async fn read_signing(
    client: &aws_sdk_secretsmanager::Client,
    source: &str,
    id: &str,
) -> Result<SigningSecret, Failed> {
    let text = read_source_secret(client, source, KeyIn::SigningSecret, id).await?;
    serde_json::from_str(&text).map_err(|e| Failed {
        error: ConfigError::at(
            SOURCES_VAR,
            format!("source '{source}': secret_id"),
            format!(
                "the secret '{id}' is not {{\"secrets\": [...]}} (line {}, column {})",
                e.line(),
                e.column()
            ),
        ),
        denied: false,
    })
}

/// The `api_key_secret_id` secret: `{"api_key": "..."}` and nothing else. A bare string is
/// refused rather than guessed at: one shape for every secret here, and a JSON typo is not
/// taken for a key.
async fn read_key_secret(
    client: &aws_sdk_secretsmanager::Client,
    source: &str,
    id: &str,
) -> Result<String, Failed> {
    let text = read_source_secret(client, source, KeyIn::OwnSecret, id).await?;
    let refused = |detail: String| Failed {
        error: ConfigError::at(
            SOURCES_VAR,
            format!("source '{source}': api_key_secret_id"),
            format!("the secret '{id}' {detail}"),
        ),
        denied: false,
    };
    if !text.trim_start().starts_with('{') {
        return Err(refused(
            "holds a bare string: store the key as JSON, {\"api_key\": \"...\"}".into(),
        ));
    }
    let secret: KeySecret = serde_json::from_str(&text)
        .map_err(|e| refused(format!("is {}", value_free(&e, "{\"api_key\": \"...\"}"))))?;
    if secret.api_key.trim().is_empty() {
        return Err(refused("holds an empty api_key".into()));
    }
    Ok(secret.api_key)
}

/// A source's secret's text; the error names the source, the field and the secret, and says
/// whether the role was refused.
async fn read_source_secret(
    client: &aws_sdk_secretsmanager::Client,
    source: &str,
    key_in: KeyIn,
    id: &str,
) -> Result<String, Failed> {
    fetch(client, id).await.map_err(|unread| Failed {
        error: ConfigError::at(
            SOURCES_VAR,
            format!("source '{source}': {}", key_in.field()),
            unread.detail,
        ),
        denied: unread.denied,
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

/// Why a secret's text was not read: the detail names the secret and the error code, never a
/// value; `denied` when the role may not read it.
struct Unread {
    detail: String,
    denied: bool,
}

async fn fetch(client: &aws_sdk_secretsmanager::Client, id: &str) -> Result<String, Unread> {
    use aws_sdk_secretsmanager::error::ProvideErrorMetadata;
    let answer = client
        .get_secret_value()
        .secret_id(id)
        .send()
        .await
        .map_err(|e| {
            let code = e.code().unwrap_or("no answer");
            Unread {
                detail: format!("the secret '{id}' could not be read ({code})"),
                denied: code == "AccessDeniedException",
            }
        })?;
    answer
        .secret_string()
        .map(str::to_owned)
        .ok_or_else(|| Unread {
            detail: format!("the secret '{id}' holds no text"),
            denied: false,
        })
}

/// A secret's text; the error says why not, without any value.
pub(crate) async fn read_text(
    client: &aws_sdk_secretsmanager::Client,
    id: &str,
) -> Result<String, String> {
    fetch(client, id).await.map_err(|unread| unread.detail)
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
    crate::platform::api_keys::parse_list(&text).map_err(|e| {
        ConfigError::at(
            API_KEYS_VAR,
            "secret_id",
            format!("the secret '{secret_id}': {e}"),
        )
    })
}
