//! `inboxctl listen`: a local receiver of effects, the way `stripe listen` is for Stripe's
//! events: it verifies each delivery's Standard Webhooks signature as the app would, answers
//! 204 (401 with the reason when the signature fails), applies each effect as docs/effects.md
//! tells an app to (a state kind latest-sequence-wins, a fact once by id, a copy not again),
//! and prints what that did: "plan free → pro", "+500 for pro in 2026-12", a copy, an older
//! state.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use shared::dev::listen::{Applied, Heard, Listener, DEFAULT_PORT};
use shared::domain::effect::Kind;
use shared::platform::config::SinkKind;
use shared::signing::standard_webhooks::{decode_secret, SecretEncoding};

#[derive(Args)]
pub struct ListenArgs {
    /// The port to listen on (127.0.0.1; 0: any free port, said on stderr).
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
        "listen: receiving effects at {} (Ctrl-C stops); applying them as docs/effects.md \
         says: a state when its sequence is the newest, a fact once by id, a copy never again",
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
            Heard::Effect(received, applied) if json_output => out!(
                "{}",
                json!({"webhook_id": received.webhook_id, "outcome": outcome(&applied),
                       "said": said(&received.body, &applied), "effect": received.body})
            ),
            Heard::Effect(received, applied) => out!(
                "{}  {}",
                line(&received.webhook_id, &received.body),
                said(&received.body, &applied)
            ),
            Heard::Refused { status, reason } if json_output => {
                eprintln!("{}", json!({"refused": status.as_u16(), "reason": reason}))
            }
            Heard::Refused { status, reason } => {
                eprintln!("listen: refused a request ({status}): {reason}")
            }
        }
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// One effect as the start of a line: id, type, customer, sequence.
fn line(webhook_id: &str, body: &Value) -> String {
    let data = &body["data"];
    format!(
        "{webhook_id}  {}  customer {}/{}  sequence {}",
        text(&body["type"]),
        text(&data["source"]),
        text(&data["customer_id"]),
        text(&data["sequence"]),
    )
}

fn outcome(applied: &Applied) -> &'static str {
    match applied {
        Applied::State | Applied::Fact => "applied",
        Applied::Copy => "copy",
        Applied::Older { .. } => "older",
        Applied::NotAnEffect => "not_an_effect",
    }
}

/// What applying one delivery did, in words.
fn said(body: &Value, applied: &Applied) -> String {
    match applied {
        Applied::State => format!("applied: {}", change(body)),
        Applied::Fact => format!("applied once: {}", change(body)),
        Applied::Copy => "a copy of an effect already applied: not applied again".to_owned(),
        Applied::Older { held } => {
            format!("older than sequence {held}, the state applied: not applied")
        }
        Applied::NotAnEffect => "no id or type: not an effect, nothing applied".to_owned(),
    }
}

/// The change an effect tells, as a person reads it. Each kind the library writes has its
/// words (the match is over [`Kind`], so a new kind cannot go without); a kind this build does
/// not know is applied as a fact, as docs/effects.md tells an app to.
fn change(body: &Value) -> String {
    let data = &body["data"];
    let kind = body["type"].as_str().unwrap_or_default();
    let Some(known) = Kind::parse(kind) else {
        return format!("{kind}, a kind this receiver does not know, kept as a fact");
    };
    match known {
        Kind::PlanChanged => format!(
            "plan {} → {}",
            text(&data["previous_plan"]),
            text(&data["plan"])
        ),
        Kind::SubscriptionUpdated => {
            let (now, before) = (&data["subscription"], &data["previous"]);
            let id = text(&now["id"]);
            match before["status"].as_str() {
                None => format!(
                    "subscription {id} {} on {}",
                    text(&now["status"]),
                    text(&now["plan"])
                ),
                Some(status) if now["status"] == before["status"] => {
                    format!("subscription {id} {status}, its plan or ends moved")
                }
                Some(status) => format!("subscription {id} {status} → {}", text(&now["status"])),
            }
        }
        Kind::FeaturesChanged => {
            let keys = |list: &Value, sign: &str| -> Vec<String> {
                list.as_array()
                    .into_iter()
                    .flatten()
                    .map(|key| format!("{sign}{}", text(key)))
                    .collect()
            };
            let mut moved = keys(&data["added"], "+");
            moved.extend(keys(&data["removed"], "-"));
            moved.extend(data["changed"].as_array().into_iter().flatten().map(|c| {
                format!(
                    "{} {} → {}",
                    text(&c["key"]),
                    text(&c["from"]),
                    text(&c["to"])
                )
            }));
            format!("features {}", moved.join(", "))
        }
        Kind::AllowanceGranted => {
            let grant = &data["grant"];
            format!(
                "+{} for {} in {}",
                text(&grant["amount"]),
                text(&grant["plan"]),
                text(&grant["period"])
            )
        }
        Kind::PaymentSucceeded | Kind::PaymentFailed | Kind::PaymentRefunded => {
            let previous = data["previous_status"].as_str().unwrap_or("new");
            format!(
                "payment {} {previous} → {}",
                text(&data["payment"]["id"]),
                text(&data["payment"]["status"])
            )
        }
        Kind::CustomerDeleted => format!("customer deleted at {}", text(&data["deleted_at"])),
        Kind::AllowanceExhausted => {
            let account = &data["account"];
            format!(
                "allowance of {} exhausted: {} used of {}",
                text(&account["period"]),
                text(&account["used"]),
                text(&account["balance"])
            )
        }
        Kind::UsageReversed => {
            let (usage, account) = (&data["usage"], &data["account"]);
            let meter = match data["meter"]["correction"].as_str() {
                Some(correction) => format!("; meter report {correction}"),
                None => String::new(),
            };
            format!(
                "debit {} of {} reversed in {}: {} used of {}{meter}",
                text(&usage["usage_id"]),
                text(&usage["amount"]),
                text(&account["period"]),
                text(&account["used"]),
                text(&account["balance"])
            )
        }
        Kind::CreditsGranted | Kind::CreditsExpired | Kind::CreditsVoided => {
            let grant = &data["grant"];
            let what = match known {
                Kind::CreditsGranted => "granted",
                Kind::CreditsExpired => "expired",
                _ => "voided",
            };
            format!(
                "credit grant {} of {} {} {what}",
                text(&grant["grant_id"]),
                text(&grant["amount"]),
                text(&grant["unit"])
            )
        }
        Kind::CreditsLow => format!(
            "credits in {} below {} at {}",
            text(&data["unit"]),
            text(&data["level"]),
            text(&data["crossed_at"])
        ),
        Kind::CreditsDepleted => format!(
            "credits in {} depleted at {}",
            text(&data["unit"]),
            text(&data["crossed_at"])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_delivery_says_what_applying_it_did() {
        let plan = json!({"type": "billing.plan_changed",
                          "data": {"plan": "pro", "previous_plan": "free"}});
        assert_eq!(said(&plan, &Applied::State), "applied: plan free → pro");
        let reversed = json!({"type": "billing.usage_reversed",
            "data": {"usage": {"usage_id": "use_1", "amount": 8},
                     "account": {"period": "2026-12", "used": 0, "balance": 500},
                     "meter": {"correction": "withdrawn"}}});
        assert_eq!(
            said(&reversed, &Applied::Fact),
            "applied once: debit use_1 of 8 reversed in 2026-12: 0 used of 500; meter report withdrawn"
        );
        let grant = json!({"type": "billing.allowance_granted",
                           "data": {"grant": {"plan": "pro", "period": "2026-12", "amount": 500}}});
        assert_eq!(
            said(&grant, &Applied::Fact),
            "applied once: +500 for pro in 2026-12"
        );
        let sub = json!({"type": "billing.subscription_updated",
            "data": {"subscription": {"id": "sub_1", "status": "canceled"},
                     "previous": {"status": "active"}}});
        assert_eq!(
            said(&sub, &Applied::State),
            "applied: subscription sub_1 active → canceled"
        );
        assert_eq!(
            said(&plan, &Applied::Older { held: 4 }),
            "older than sequence 4, the state applied: not applied"
        );
        assert!(said(&plan, &Applied::Copy).contains("not applied again"));
    }

    /// `billing.features_changed` is a state (docs/effects.md): the receiver applies it as one
    /// and says what moved, never that it does not know the kind.
    #[test]
    fn a_features_change_is_said_as_the_features_that_moved() {
        let features = json!({"type": "billing.features_changed",
            "data": {"added": ["sso"], "removed": ["beta"],
                     "changed": [{"key": "seats", "from": 5, "to": 20}],
                     "features": {"sso": true, "seats": 20}}});
        assert_eq!(
            said(&features, &Applied::State),
            "applied: features +sso, -beta, seats 5 → 20"
        );
        let unknown = json!({"type": "billing.something_new", "data": {}});
        assert_eq!(
            said(&unknown, &Applied::Fact),
            "applied once: billing.something_new, a kind this receiver does not know, kept as a fact"
        );
    }

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
