//! `inboxctl listen`: a local receiver of effects, the way `stripe listen` is for Stripe's
//! events: it verifies each delivery's Standard Webhooks signature as the app would, answers
//! 204 (401 with the reason when the signature fails) and prints each effect.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use shared::dev::listen::{Heard, Listener, DEFAULT_PORT};
use shared::platform::config::SinkKind;
use shared::signing::standard_webhooks::{decode_secret, SecretEncoding};

#[derive(Args)]
pub struct ListenArgs {
    /// The port to listen on (127.0.0.1).
    #[arg(long, env = "INBOX_LISTEN_PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// The signing secret, whsec_<base64> (default: the webhook sink's secret in
    /// INBOX_EFFECTS).
    #[arg(long, hide_env_values = true)]
    pub secret: Option<String>,
}

/// The secret to verify with: the one given, else the first webhook sink's in INBOX_EFFECTS.
fn secret(args: &ListenArgs) -> anyhow::Result<String> {
    if let Some(secret) = &args.secret {
        return Ok(secret.clone());
    }
    let raw = std::env::var(shared::platform::config::EFFECTS_VAR).unwrap_or_default();
    if raw.trim().is_empty() {
        anyhow::bail!("no secret: pass --secret whsec_… or set INBOX_EFFECTS with a webhook sink");
    }
    let sinks = shared::platform::config::parse_sinks(&raw)?;
    sinks
        .into_iter()
        .filter(|s| s.kind == SinkKind::Webhook)
        .find_map(|s| s.secret)
        .context("INBOX_EFFECTS has no webhook sink with an inline secret; pass --secret")
}

pub async fn run(args: &ListenArgs, json_output: bool) -> anyhow::Result<()> {
    let key = decode_secret(&secret(args)?, SecretEncoding::Base64)
        .map_err(|e| anyhow::anyhow!("the secret: {e}"))?;
    let (tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let addr = SocketAddr::from(([127, 0, 0, 1], args.port));
    let listener = Listener::start_with(addr, vec![key], Some(tx))
        .await
        .with_context(|| format!("listening on {addr}"))?;
    eprintln!(
        "listen: receiving effects at {} (Ctrl-C stops)",
        listener.url()
    );
    loop {
        let next = tokio::select! {
            next = heard.recv() => next,
            signal = tokio::signal::ctrl_c() => {
                signal.context("waiting for Ctrl-C")?;
                return Ok(());
            }
        };
        let Some(next) = next else {
            return Ok(());
        };
        match next {
            Heard::Effect(received) if json_output => out!("{}", received.body),
            Heard::Effect(received) => out!("{}", line(&received.webhook_id, &received.body)),
            Heard::Refused { status, reason } if json_output => {
                eprintln!("{}", json!({"refused": status.as_u16(), "reason": reason}))
            }
            Heard::Refused { status, reason } => {
                eprintln!("listen: refused a request ({status}): {reason}")
            }
        }
    }
}

/// One effect as a line: id, type, customer, sequence.
fn line(webhook_id: &str, body: &Value) -> String {
    let data = &body["data"];
    let text = |v: &Value| {
        v.as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v.to_string())
    };
    format!(
        "{webhook_id}  {}  customer {}/{}  sequence {}",
        text(&body["type"]),
        text(&data["source"]),
        text(&data["customer_id"]),
        text(&data["sequence"]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_effect_is_one_line_with_its_id_type_customer_and_sequence() {
        let body = json!({"id": "eff_1", "type": "billing.plan_changed",
                          "data": {"source": "stripe", "customer_id": "cus_1", "sequence": 3}});
        assert_eq!(
            line("eff_1", &body),
            "eff_1  billing.plan_changed  customer stripe/cus_1  sequence 3"
        );
    }
}
