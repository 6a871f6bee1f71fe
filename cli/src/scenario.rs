//! `inboxctl scenario`: the reference delivery scripts (docs/design.md §4.9) against the running stack,
//! printed as a timeline beside what a handler that applies each delivery on arrival shows. The
//! scripts and that handler's model are the Engine Room's (`shared::handlers::engine_room::scenario`).

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Duration as Span, Utc};
use clap::{Args, ValueEnum};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use serde_json::json;
use sqlx::PgPool;

use crate::send::{Sender, DEFAULT_INTAKE_URL};
use shared::domain::{CustomerId, Period, ProviderTime};
use shared::handlers::engine_room::scenario::{AccountLine, OnArrival, Scenario};
use shared::providers::fixtures::Spec;

#[derive(Clone, Copy, ValueEnum)]
pub enum Name {
    /// Plan change to Pro ×3, payment ×5, a cancellation from before the upgrade arriving 7th.
    NineDeliveries,
    /// Two subscriptions, their activations and revocations in a scrambled order.
    Subscriptions,
    /// trialing → active → past_due, with `active` landing last.
    Status,
    /// paid, refunded, then a late paid.
    Refund,
    /// status, on Paddle Billing.
    StatusPaddle,
    /// refund, on Lemon Squeezy orders.
    #[value(name = "refund-lemonsqueezy")]
    RefundLemonSqueezy,
    /// status, sent as Stripe thin events whose objects the worker reads (the source's
    /// `api_base_url` the provider fakes', `inboxctl fakes`).
    StatusThin,
}

impl Name {
    fn scenario(self) -> Scenario {
        match self {
            Self::NineDeliveries => Scenario::NineDeliveries,
            Self::Subscriptions => Scenario::Subscriptions,
            Self::Status => Scenario::Status,
            Self::Refund => Scenario::Refund,
            Self::StatusPaddle => Scenario::StatusPaddle,
            Self::RefundLemonSqueezy => Scenario::RefundLemonSqueezy,
            Self::StatusThin => Scenario::StatusThin,
        }
    }
}

#[derive(Args)]
pub struct ScenarioArgs {
    pub name: Name,
    #[arg(long, env = "INTAKE_URL", default_value = DEFAULT_INTAKE_URL)]
    pub intake_url: String,
    #[arg(long, env = "INBOX_PLANS", hide_env_values = true)]
    pub plans: String,
    #[command(flatten)]
    pub signing: crate::send::SigningArgs,
}

pub async fn run(args: &ScenarioArgs, pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let catalog = shared::platform::config::parse_plans(&args.plans)?;
    let sender = args.signing.sender(&args.intake_url).await?;
    let script = args.name.scenario().script();
    let source = script.source;
    let run_id = &uuid_suffix();
    let customer = format!("scn_{run_id}");
    let start: DateTime<Utc> = Utc::now() - Span::days(1);
    let http = reqwest::Client::new();

    // The starting point (nine deliveries: Free, with its allowance).
    if let Some(first) = &script.start {
        let spec = first.spec(&customer, run_id, start);
        deliver(&sender, &http, pool, source, &spec, script.thin).await?;
    }
    let mut on_arrival = OnArrival::start(&catalog);
    let mut rows = Vec::new();
    let progress = if json_output {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(script.steps.len() as u64)
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} deliveries applied {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for (n, s) in script.steps.iter().enumerate() {
        let spec = s.spec(&customer, run_id, start);
        let at = spec.at;
        let (answer, outcome) = deliver(&sender, &http, pool, source, &spec, script.thin).await?;
        on_arrival.apply(s.naive, &catalog);
        let mut conn = pool.acquire().await?;
        let period = Period::of(ProviderTime::from(at));
        let customer_id = CustomerId::parse(&customer)?;
        let account =
            shared::billing::account::load(&mut conn, source, &customer_id, &period, &catalog)
                .await?;
        let AccountLine {
            plan,
            balance,
            status,
        } = AccountLine::of(account.as_ref());
        let naive = &on_arrival.0;
        rows.push(json!({
            "n": n + 1, "delivery": s.label(),
            "provider_time": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), "answer": answer, "outcome": outcome,
            "plan": plan, "balance": balance, "status": status,
            "naive_plan": naive.plan, "naive_balance": naive.balance, "naive_status": naive.status,
        }));
        progress.inc(1);
    }
    progress.finish_and_clear();
    let last = rows.last().cloned().unwrap_or_default();
    if json_output {
        crate::output::emit(
            &json!({"customer_id": customer, "timeline": rows, "final": last}).to_string(),
        );
        return Ok(());
    }
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY).set_header(vec![
        "#",
        "delivery",
        "provider time",
        "answer",
        "outcome",
        "plan",
        "balance",
        "status",
        "on arrival: plan",
        "balance",
        "status",
    ]);
    for r in &rows {
        let cell = |k: &str| match &r[k] {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        t.add_row(vec![
            cell("n"),
            cell("delivery"),
            cell("provider_time"),
            cell("answer"),
            cell("outcome"),
            cell("plan"),
            cell("balance"),
            cell("status"),
            cell("naive_plan"),
            cell("naive_balance"),
            cell("naive_status"),
        ]);
    }
    out!("customer {customer} ({source})\n{t}");
    out!(
        "billing-inbox: {}, balance {}, status {} | applied on arrival: {}, balance {}, status {}",
        last["plan"].as_str().unwrap_or("-"),
        last["balance"],
        last["status"].as_str().unwrap_or("-"),
        last["naive_plan"].as_str().unwrap_or("-"),
        last["naive_balance"],
        last["naive_status"].as_str().unwrap_or("-"),
    );
    if matches!(args.name, Name::NineDeliveries) {
        out!("(the crash between the plan write and the allowance write is injected by the test suite, not here)");
    }
    Ok(())
}

fn uuid_suffix() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    id[..8].to_owned()
}

/// Sends one delivery and waits (bounded) until the pipeline has finished its event.
async fn deliver(
    sender: &Sender,
    http: &reqwest::Client,
    pool: &PgPool,
    source: &str,
    spec: &Spec,
    thin: bool,
) -> anyhow::Result<(String, String)> {
    let (id, payload) = sender.build(source, spec)?;
    // A thin event: the fake first holds the snapshot's object, which the worker reads.
    let (id, payload) = match thin {
        true => {
            let twin = crate::send::thin(sender, http, source, &payload).await?;
            (twin["id"].as_str().unwrap_or(&id).to_owned(), twin)
        }
        false => (id, payload),
    };
    let delivery = sender.sign(source, &id, &payload)?;
    let answer = sender.post(http, source, &delivery).await?;
    anyhow::ensure!(
        answer.status == 200,
        "the intake answered {} {}",
        answer.status,
        answer.body
    );
    let event_id = answer.body["event_id"]
        .as_i64()
        .context("the intake's answer has no event_id")?;
    let verdict = answer.body["status"].as_str().unwrap_or("?").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row: (String, Option<String>) =
            sqlx::query_as("SELECT status, reason FROM inbox_events WHERE id = $1")
                .bind(event_id)
                .fetch_one(pool)
                .await
                .context("reading the event's status")?;
        if matches!(
            row.0.as_str(),
            "applied" | "ignored" | "unprocessable" | "dead"
        ) {
            let outcome = match row.1 {
                Some(reason) if row.0 != "applied" => format!("{}: {reason}", row.0),
                _ => row.0,
            };
            return Ok((verdict, outcome));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "event {event_id} is still {} after 60 s; is the bridge (scripts/dev) running?",
            row.0
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
