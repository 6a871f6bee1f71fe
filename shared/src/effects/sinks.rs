//! The sinks an effect is delivered to (`INBOX_EFFECTS`): the app's endpoint, signed as
//! Standard Webhooks (`webhook-id` = the effect id), and an EventBridge bus (`PutEvents`).
//! A delivery either lands (a 2xx, an accepted entry) or fails with an error that names the
//! sink and why, never the body or the secret.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use crate::platform::aws_limits;
use crate::platform::config::{ConfigError, SinkConfig, SinkKind, EFFECTS_VAR};
use crate::signing::standard_webhooks::{
    decode_secret, signature, SecretEncoding, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};

/// How long the app's endpoint has to answer one delivery.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// The `Source` of every event put on an EventBridge bus.
pub const EVENT_SOURCE: &str = "billing-inbox";

/// One effect as it leaves: its id, its kind and its body, serialized once; the bytes signed
/// are the bytes sent.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub id: &'a str,
    pub kind: &'a str,
    pub body: &'a [u8],
}

/// A delivery that did not land.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sink '{sink}': {detail}")]
pub struct SinkError {
    pub sink: String,
    pub detail: String,
}

/// One configured sink.
pub struct Sink {
    pub name: String,
    target: Target,
}

enum Target {
    Webhook { url: String, key: Vec<u8> },
    EventBridge { bus: String },
}

impl Sink {
    pub fn kind(&self) -> SinkKind {
        match self.target {
            Target::Webhook { .. } => SinkKind::Webhook,
            Target::EventBridge { .. } => SinkKind::Eventbridge,
        }
    }
}

/// The configured sinks and the clients that reach them, built once per cold start.
pub struct Sinks {
    sinks: Vec<Sink>,
    http: reqwest::Client,
    /// Built on the first EventBridge delivery: a cold start reads no AWS configuration it
    /// does not use.
    eventbridge: Arc<OnceCell<aws_sdk_eventbridge::Client>>,
}

impl Default for Sinks {
    fn default() -> Self {
        Self {
            sinks: Vec::new(),
            http: webhook_client(),
            eventbridge: Arc::default(),
        }
    }
}

/// The HTTP client of webhook sinks: a 10 s budget, and no redirects (an endpoint that
/// moved answers 3xx, which is a failure an operator should see).
fn webhook_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(WEBHOOK_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}

impl Sinks {
    /// The sinks of `INBOX_EFFECTS` whose secrets are inline (or already read from Secrets
    /// Manager by [`crate::platform::secrets::resolve_sinks`]).
    pub fn from_config(configs: &[SinkConfig]) -> Result<Self, ConfigError> {
        let mut sinks = Vec::with_capacity(configs.len());
        for config in configs {
            let at = |field: &str| format!("sink '{}': {field}", config.name);
            let target =
                match config.kind {
                    SinkKind::Webhook => {
                        let url = config.url.clone().ok_or_else(|| {
                            ConfigError::at(EFFECTS_VAR, at("url"), "is required")
                        })?;
                        let secret = config.secret.as_deref().ok_or_else(|| {
                            ConfigError::at(EFFECTS_VAR, at("secret"), "is not set nor read")
                        })?;
                        let key = decode_secret(secret, SecretEncoding::Base64)
                            .map_err(|detail| ConfigError::at(EFFECTS_VAR, at("secret"), detail))?;
                        Target::Webhook { url, key }
                    }
                    SinkKind::Eventbridge => Target::EventBridge {
                        bus: config.bus.clone().ok_or_else(|| {
                            ConfigError::at(EFFECTS_VAR, at("bus"), "is required")
                        })?,
                    },
                };
            sinks.push(Sink {
                name: config.name.clone(),
                target,
            });
        }
        Ok(Self {
            sinks,
            ..Self::default()
        })
    }

    /// Reads the sinks' secrets from Secrets Manager (once, at cold start), then builds them.
    pub async fn resolve(configs: &[SinkConfig]) -> Result<Self, ConfigError> {
        Self::from_config(&crate::platform::secrets::resolve_sinks(configs).await?)
    }

    /// These sinks with `client` for their EventBridge deliveries in place of one configured
    /// from the environment (the tests' client, which checks every request it sends).
    pub fn with_eventbridge_client(self, client: aws_sdk_eventbridge::Client) -> Self {
        Self {
            eventbridge: Arc::new(OnceCell::new_with(Some(client))),
            ..self
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Sink> {
        self.sinks.iter()
    }

    /// Delivers one effect to one sink.
    #[tracing::instrument(skip_all, fields(effect_id = effect.id, sink = %sink.name))]
    pub async fn deliver(&self, sink: &Sink, effect: Outgoing<'_>) -> Result<(), SinkError> {
        let result = match &sink.target {
            Target::Webhook { url, key } => self.post(url, key, effect).await,
            Target::EventBridge { bus } => Box::pin(self.put_event(bus, effect)).await,
        };
        result.map_err(|detail| SinkError {
            sink: sink.name.clone(),
            detail,
        })
    }

    /// POSTs the body, signed now; a 2xx is delivered.
    async fn post(&self, url: &str, key: &[u8], effect: Outgoing<'_>) -> Result<(), String> {
        let timestamp = chrono::Utc::now().timestamp();
        let answer = self
            .http
            .post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(ID_HEADER, effect.id)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(
                SIGNATURE_HEADER,
                signature(key, effect.id, timestamp, effect.body),
            )
            .body(effect.body.to_vec())
            .send()
            .await
            .map_err(|e| request_error(&e))?;
        let status = answer.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("the endpoint answered {status}"))
        }
    }

    /// Puts the effect on the bus: `Source` billing-inbox, `DetailType` the kind, `Detail`
    /// the body, one entry a request. An entry the bus refused is a failure, and so is one
    /// EventBridge would refuse ([`aws_limits::put_events_entry_problem`]: 256 KB or more, a
    /// detail that is not a JSON object), which is not sent: the effect is retried on the
    /// outbox's schedule and ends `dead`, alerted on, with the reason as its last error.
    async fn put_event(&self, bus: &str, effect: Outgoing<'_>) -> Result<(), String> {
        use aws_sdk_eventbridge::types::PutEventsRequestEntry;
        let detail = std::str::from_utf8(effect.body).map_err(|_| "the body is not UTF-8")?;
        if let Some(problem) =
            aws_limits::put_events_entry_problem(EVENT_SOURCE, effect.kind, detail)
        {
            return Err(format!("not put on the bus: {problem}"));
        }
        let client = self.eventbridge().await;
        let entry = PutEventsRequestEntry::builder()
            .source(EVENT_SOURCE)
            .detail_type(effect.kind)
            .detail(detail)
            .event_bus_name(bus)
            .build();
        let output = client
            .put_events()
            .entries(entry)
            .send()
            .await
            .map_err(|e| {
                format!(
                    "PutEvents failed: {}",
                    aws_sdk_eventbridge::error::DisplayErrorContext(&e)
                )
            })?;
        let refused = output.failed_entry_count() > 0
            || output.entries().iter().any(|e| e.error_code().is_some());
        if refused {
            let (code, message) = output
                .entries()
                .iter()
                .find(|e| e.error_code().is_some())
                .map(|e| {
                    (
                        e.error_code().unwrap_or("?"),
                        e.error_message().unwrap_or(""),
                    )
                })
                .unwrap_or(("?", ""));
            return Err(format!("the bus refused the event ({code}: {message})"));
        }
        Ok(())
    }

    /// The EventBridge client, configured like every AWS client here on first use. Boxed:
    /// loading the AWS configuration is a large future.
    async fn eventbridge(&self) -> &aws_sdk_eventbridge::Client {
        let build = || -> crate::BoxFuture<'static, aws_sdk_eventbridge::Client> {
            Box::pin(async {
                aws_sdk_eventbridge::Client::new(&crate::platform::queue::sdk_config().await)
            })
        };
        Box::pin(self.eventbridge.get_or_init(build)).await
    }
}

/// Why a request got no answer, without its URL (it may carry a token).
fn request_error(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return format!("no answer within {} s", WEBHOOK_TIMEOUT.as_secs());
    }
    let what = if error.is_connect() {
        "could not connect"
    } else {
        "the request failed"
    };
    let mut chain = Vec::new();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        chain.push(cause.to_string());
        source = cause.source();
    }
    match chain.last() {
        Some(root) => format!("{what} ({root})"),
        None => what.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::config::parse_sinks;

    #[test]
    fn sinks_are_built_from_their_config_and_an_unread_secret_is_named() {
        let configs = parse_sinks(
            r#"[{"name":"app","kind":"webhook","url":"http://127.0.0.1:1/x","secret":"whsec_c2VjcmV0"},
                {"name":"bus","kind":"eventbridge","bus":"billing"}]"#,
        )
        .unwrap();
        let sinks = Sinks::from_config(&configs).unwrap();
        let kinds: Vec<_> = sinks.iter().map(|s| (s.name.as_str(), s.kind())).collect();
        assert_eq!(
            kinds,
            [("app", SinkKind::Webhook), ("bus", SinkKind::Eventbridge)]
        );

        let unread = parse_sinks(
            r#"[{"name":"app","kind":"webhook","url":"http://127.0.0.1:1/x","secret_id":"s"}]"#,
        )
        .unwrap();
        let error = Sinks::from_config(&unread).err().unwrap();
        assert_eq!(
            error.to_string(),
            "INBOX_EFFECTS: sink 'app': secret: is not set nor read"
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_a_failure_naming_the_sink() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let configs = parse_sinks(&format!(
            r#"[{{"name":"app","kind":"webhook","url":"http://127.0.0.1:{port}/hook?token=t0ken","secret":"whsec_c2VjcmV0"}}]"#
        ))
        .unwrap();
        let sinks = Sinks::from_config(&configs).unwrap();
        let sink = sinks.iter().next().unwrap();
        let effect = Outgoing {
            id: "eff_1",
            kind: "billing.plan_changed",
            body: br#"{"id":"eff_1"}"#,
        };
        let error = sinks.deliver(sink, effect).await.unwrap_err();
        assert_eq!(error.sink, "app");
        let shown = error.to_string();
        assert!(
            shown.starts_with("sink 'app': could not connect"),
            "{shown}"
        );
        assert!(
            !shown.contains("t0ken") && !shown.contains("eff_1"),
            "{shown}"
        );
    }
}
