//! `inboxctl send`: a realistic delivery, signed with the source's configured secret.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::{json, Value};

use shared::platform::config::parse_sources;
use shared::providers::fixtures::{self, KindeKey, Spec};

pub const DEFAULT_INTAKE_URL: &str = "http://127.0.0.1:61900/lambda-url/intake";

#[derive(Args)]
pub struct SendArgs {
    /// The source's name in INBOX_SOURCES (its route segment).
    pub source: String,
    /// The event kind: subscription, subscription-deleted, invoice-paid, payment-failed,
    /// refund, entitlements (Stripe); subscription, revoked, order-paid, order-refunded,
    /// benefit-grant-created, benefit-grant-updated, benefit-grant-cycled,
    /// benefit-grant-revoked (Standard Webhooks / Polar); plan-assigned, plan-changed,
    /// agreement-cancelled, payment-succeeded, payment-failed, invoice-overdue (Kinde);
    /// subscription, subscription-canceled, transaction-completed, payment-failed, refund
    /// (Paddle); subscription, expired, order-created, order-refunded, payment-success,
    /// payment-failed (Lemon Squeezy).
    pub kind: String,
    #[arg(long, default_value = "cus_demo")]
    pub customer: String,
    /// Plan key, price id or product id (default: the provider's pro plan in the dev catalog).
    #[arg(long)]
    pub plan: Option<String>,
    /// The provider's time for the event, RFC 3339 (default: now).
    #[arg(long)]
    pub at: Option<String>,
    /// Deliver the same signed delivery this many times.
    #[arg(long, default_value_t = 1)]
    pub copies: u32,
    /// The subscription / order / invoice / payment id.
    #[arg(long)]
    pub object: Option<String>,
    /// A subscription's status (default: active).
    #[arg(long)]
    pub status: Option<String>,
    /// A subscription event: the customer scheduled its cancellation at period end.
    #[arg(long)]
    pub cancel_at_period_end: bool,
    /// The event's id (the dedupe key); random by default.
    #[arg(long)]
    pub id: Option<String>,
    /// An entitlement event's feature: `sso`, or `key=value` (`seats=20`, `export=csv`).
    #[arg(long)]
    pub feature: Option<String>,
    /// Stripe: deliver the event's thin twin (`v1.<type>`, its object named, not carried), and
    /// first tell the source's provider API (`inboxctl fakes`, at its `api_base_url`) to hold
    /// the object the worker will read.
    #[arg(long)]
    pub thin: bool,
    /// The intake's base URL; the delivery goes to {url}/webhooks/{source}.
    #[arg(long, env = "INTAKE_URL", default_value = DEFAULT_INTAKE_URL)]
    pub intake_url: String,
    #[command(flatten)]
    pub signing: SigningArgs,
}

/// What signing a delivery needs: the sources as the functions read them, and for Kinde
/// the local signing key. Shared by `send`, `scenario` and `bench`.
#[derive(Args)]
pub struct SigningArgs {
    /// The sources, as the functions read them.
    #[arg(long, env = "INBOX_SOURCES", hide_env_values = true)]
    pub sources: String,
    /// For Kinde sources: the PEM private key whose public half the local JWKS serves.
    #[arg(long, env = "INBOX_DEV_KINDE_KEY")]
    pub kinde_key: Option<std::path::PathBuf>,
    #[arg(long, env = "INBOX_DEV_KINDE_KID", default_value = "dev-key")]
    pub kinde_kid: String,
}

impl SigningArgs {
    pub async fn sender(&self, intake_url: &str) -> anyhow::Result<Sender> {
        Sender::new(
            &self.sources,
            self.kinde_key.as_deref(),
            &self.kinde_kid,
            intake_url,
        )
        .await
    }
}

/// The intake refused a delivery (any answer but 2xx): `send` printed the answers, and
/// exits 1.
#[derive(Debug, thiserror::Error)]
#[error("the intake refused the delivery: {status} {detail}")]
pub struct Refused {
    pub status: u16,
    pub detail: String,
}

/// One delivery's answer.
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

pub async fn run(args: &SendArgs, json_output: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=100).contains(&args.copies),
        "--copies must be between 1 and 100"
    );
    let at = match &args.at {
        Some(raw) => DateTime::parse_from_rfc3339(raw)
            .with_context(|| format!("--at must be an RFC 3339 time, got '{raw}'"))?
            .with_timezone(&Utc),
        None => Utc::now(),
    };
    let spec = Spec {
        kind: args.kind.clone(),
        customer: args.customer.clone(),
        plan: args.plan.clone(),
        at,
        object_id: args.object.clone(),
        status: args.status.clone(),
        cancel_at_period_end: args.cancel_at_period_end,
        event_id: args.id.clone(),
        feature: args.feature.clone(),
    };
    let http = reqwest::Client::new();
    let mut answers = Vec::new();
    let sender = args.signing.sender(&args.intake_url).await?;
    let (id, mut payload) = sender.build(&args.source, &spec)?;
    if args.thin {
        payload = thin(&sender, &http, &args.source, &payload).await?;
    }
    let delivery = sender.sign(&args.source, &id, &payload)?;
    let event_type = event_type(&sender, &args.source, &payload);
    let mut refused = None;
    for _ in 0..args.copies {
        let answer = sender.post(&http, &args.source, &delivery).await?;
        if !json_output {
            out!(
                "{} {} -> {} {}",
                args.source,
                event_type.as_deref().unwrap_or("?"),
                answer.status,
                answer.body
            );
        }
        answers.push(json!({"status": answer.status, "body": answer.body}));
        if !(200..300).contains(&answer.status) && refused.is_none() {
            refused = Some(answer);
        }
    }
    if json_output {
        out!(
            "{}",
            json!({"id": id, "type": event_type, "answers": answers})
        );
    }
    // 200 is stored (or a copy counted); anything else stored nothing.
    match refused {
        Some(answer) => Err(Refused {
            status: answer.status,
            detail: answer.body.to_string(),
        }
        .into()),
        None => Ok(()),
    }
}

/// The thin twin of the Stripe `snapshot`, once the fake at the source's `api_base_url` holds
/// its object.
pub(crate) async fn thin(
    sender: &Sender,
    http: &reqwest::Client,
    source: &str,
    snapshot: &Value,
) -> anyhow::Result<Value> {
    let config = sender.source(source)?;
    anyhow::ensure!(
        config.kind == shared::domain::SourceKind::Stripe,
        "--thin is for Stripe sources; '{source}' is not one"
    );
    let twin = shared::providers::stripe::fixtures::thin_twin(snapshot)
        .context("this kind of event has no thin twin")?;
    let api = config.api_base_url.as_deref().with_context(|| {
        format!(
            "a thin event's object is read from the provider API: '{source}' has no api_base_url"
        )
    })?;
    crate::fakes::hold(http, api, &snapshot["data"]["object"]).await?;
    Ok(twin)
}

/// Builds, signs and posts deliveries for the configured sources.
pub struct Sender {
    sources: Vec<shared::platform::config::SourceConfig>,
    kinde_key: Option<KindeKey>,
    intake_url: String,
}

impl Sender {
    /// Reads the sources; a source's `secret_id` is read from Secrets Manager with the
    /// caller's AWS credentials, as the intake reads it.
    pub async fn new(
        sources: &str,
        kinde_key: Option<&std::path::Path>,
        kinde_kid: &str,
        intake_url: &str,
    ) -> anyhow::Result<Self> {
        let sources = parse_sources(sources).map_err(|e| anyhow::anyhow!("{e}"))?;
        shared::providers::check_sources(&sources)?;
        let sources = shared::platform::secrets::resolve(
            &sources,
            shared::platform::secrets::Needs::Signing,
            shared::platform::secrets::OnFailure::Stop,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        let kinde_key = match kinde_key {
            Some(path) => Some(KindeKey {
                pem: std::fs::read(path)
                    .with_context(|| format!("reading the Kinde key {}", path.display()))?,
                kid: kinde_kid.to_owned(),
            }),
            None => None,
        };
        Ok(Self {
            sources,
            kinde_key,
            intake_url: intake_url.trim_end_matches('/').to_owned(),
        })
    }

    pub fn sources(&self) -> &[shared::platform::config::SourceConfig] {
        &self.sources
    }

    /// Whether deliveries of this kind of source can be signed here (a kind that signs with a
    /// private key, as Kinde does, needs the key).
    pub fn can_sign(&self, kind: shared::domain::SourceKind) -> bool {
        !fixtures::signs_with_a_key(kind) || self.kinde_key.is_some()
    }

    fn source(&self, name: &str) -> anyhow::Result<&shared::platform::config::SourceConfig> {
        self.sources
            .iter()
            .find(|s| s.name == name)
            .with_context(|| {
                let names: Vec<&str> = self.sources.iter().map(|s| s.name.as_str()).collect();
                format!(
                    "no source '{name}' in INBOX_SOURCES (configured: {})",
                    names.join(", ")
                )
            })
    }

    pub fn build(&self, source: &str, spec: &Spec) -> anyhow::Result<(String, Value)> {
        fixtures::payload(self.source(source)?.kind, spec).map_err(|e| anyhow::anyhow!(e))
    }

    pub fn sign(
        &self,
        source: &str,
        id: &str,
        payload: &Value,
    ) -> anyhow::Result<fixtures::SignedDelivery> {
        fixtures::sign_delivery(self.source(source)?, id, payload, self.kinde_key.as_ref())
            .map_err(|e| anyhow::anyhow!(e))
    }

    pub async fn post(
        &self,
        http: &reqwest::Client,
        source: &str,
        delivery: &fixtures::SignedDelivery,
    ) -> anyhow::Result<Answer> {
        let url = format!("{}/webhooks/{source}", self.intake_url);
        let mut request = http.post(&url).body(delivery.body.clone());
        for (name, value) in &delivery.headers {
            request = request.header(name, value);
        }
        let response = request.send().await.with_context(|| {
            format!("the intake is not reachable at {url} (is scripts/dev running?)")
        })?;
        let status = response.status().as_u16();
        let body = response.json().await.unwrap_or(Value::Null);
        Ok(Answer { status, body })
    }
}

/// The event's type where the source kind's payloads name it.
fn type_in(source: shared::domain::SourceKind, payload: &Value) -> Option<String> {
    fixtures::event_type(source, payload).map(str::to_owned)
}

/// The type of the event a delivery carries, as the source's provider names it.
fn event_type(sender: &Sender, source: &str, payload: &Value) -> Option<String> {
    type_in(sender.source(source).ok()?.kind, payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::domain::SourceKind;

    /// `send` says each delivery by its event's type, for every provider's every kind.
    #[test]
    fn every_kind_of_every_provider_is_said_by_its_event_type() {
        for &source in SourceKind::ALL {
            for kind in fixtures::all_kinds(source) {
                let spec = Spec {
                    kind: kind.to_owned(),
                    customer: "cus_1".into(),
                    plan: Some(fixtures::sample_plan(source).into()),
                    at: Utc::now(),
                    ..Default::default()
                };
                let (_, payload) = fixtures::payload(source, &spec).unwrap();
                let said = type_in(source, &payload);
                assert!(
                    said.as_deref().is_some_and(|t| !t.is_empty()),
                    "{source:?} {kind}: {said:?}"
                );
            }
        }
    }

    /// `send --help` names every kind `send` builds, of every provider.
    #[test]
    fn the_help_names_every_kind_of_every_provider() {
        let command = SendArgs::augment_args(clap::Command::new("send"));
        let help = command
            .get_arguments()
            .find(|a| a.get_id() == "kind")
            .and_then(|a| a.get_help())
            .unwrap()
            .to_string();
        for &source in SourceKind::ALL {
            for kind in fixtures::all_kinds(source) {
                let named = help
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                    .any(|word| word == kind);
                assert!(named, "{source:?} {kind} is not in: {help}");
            }
        }
    }
}
