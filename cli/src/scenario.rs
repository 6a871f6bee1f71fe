//! `inboxctl scenario`: the reference delivery scripts (docs/design.md §4.9) against the running stack,
//! printed as a timeline beside what a handler that applies each delivery on arrival shows.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Duration as Span, Utc};
use clap::{Args, ValueEnum};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use serde_json::json;
use sqlx::PgPool;

use crate::send::{Sender, DEFAULT_INTAKE_URL};
use shared::domain::Catalog;
use shared::domain::{CustomerId, Period, ProviderTime};
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

/// What a handler that applies on arrival does with one delivery.
#[derive(Clone, Copy)]
enum Naive {
    /// Moves the plan and tops the balance up to it.
    Plan(&'static str),
    /// Tops the balance up to the current plan's allowance again.
    Payment,
    /// Drops to free.
    Cancel,
    /// Sets the status it reads.
    Status(&'static str),
}

struct Step {
    source: &'static str,
    kind: &'static str,
    /// Which event this delivery carries: the same tag is the same event (a copy).
    tag: &'static str,
    plan: Option<&'static str>,
    object: Option<&'static str>,
    status: Option<&'static str>,
    /// Minutes after the scenario's start, in provider time.
    at_minutes: i64,
    naive: Naive,
}

impl Step {
    fn new(
        source: &'static str,
        kind: &'static str,
        tag: &'static str,
        at_minutes: i64,
        naive: Naive,
    ) -> Self {
        Self {
            source,
            kind,
            tag,
            plan: None,
            object: None,
            status: None,
            at_minutes,
            naive,
        }
    }

    fn plan(mut self, plan: &'static str) -> Self {
        self.plan = Some(plan);
        self
    }

    fn object(mut self, object: &'static str) -> Self {
        self.object = Some(object);
        self
    }

    fn status(mut self, status: &'static str) -> Self {
        self.status = Some(status);
        self
    }
}

fn script(name: Name) -> (&'static str, Vec<Step>) {
    use Naive::*;
    match name {
        Name::NineDeliveries => {
            let up = || Step::new("kinde", "plan-changed", "up", 10, Plan("pro")).plan("pro");
            let pay = || {
                Step::new("kinde", "payment-succeeded", "pay", 11, Payment)
                    .plan("pro")
                    .object("pay_1")
            };
            let cancel = Step::new("kinde", "agreement-cancelled", "cancel", 7, Cancel);
            (
                "kinde",
                vec![up(), up(), up(), pay(), pay(), pay(), cancel, pay(), pay()],
            )
        }
        Name::Subscriptions => {
            let s = |tag, kind, object, days: i64, naive| {
                Step::new("polar", kind, tag, days * 1440, naive)
                    .plan("prod_pro")
                    .object(object)
            };
            (
                "polar",
                vec![
                    s("a1", "subscription", "sub_old", 0, Plan("pro")),
                    s("r1", "revoked", "sub_old", 31, Cancel),
                    s("a1b", "subscription", "sub_old", 0, Plan("pro")),
                    s("a2", "subscription", "sub_new", 59, Plan("pro")),
                    s("r2", "revoked", "sub_old", 90, Cancel),
                    s("r3", "revoked", "sub_new", 45, Cancel),
                    s("r4", "revoked", "sub_new", 120, Cancel),
                ],
            )
        }
        Name::Status => {
            let s = |tag, status, at, naive| {
                Step::new("stripe", "subscription", tag, at, naive)
                    .plan("price_pro")
                    .object("sub_status")
                    .status(status)
            };
            (
                "stripe",
                vec![
                    s("trial", "trialing", 0, Status("trialing")),
                    s("past_due", "past_due", 2, Status("past_due")),
                    s("active", "active", 1, Status("active")),
                ],
            )
        }
        Name::Refund => {
            let s = |tag, kind, at, naive| {
                Step::new("polar", kind, tag, at, naive)
                    .plan("prod_pro")
                    .object("ord_1")
            };
            (
                "polar",
                vec![
                    s("paid", "order-paid", 0, Status("paid")),
                    s("refund", "order-refunded", 1, Status("refunded")),
                    s("late", "order-paid", 2, Status("paid")),
                ],
            )
        }
    }
}

/// The account as the naive handler leaves it.
struct NaiveState {
    plan: String,
    balance: i64,
    status: String,
}

impl NaiveState {
    fn apply(&mut self, naive: Naive, catalog: &Catalog) {
        let allowance = |plan: &str| catalog.allowance_of(plan).unwrap_or(0);
        let free = allowance("free");
        match naive {
            Naive::Plan(key) => {
                let plan = catalog
                    .get(key)
                    .map(|p| p.plan.clone())
                    .unwrap_or_else(|| key.to_owned());
                self.balance += allowance(&plan) - free;
                self.plan = plan;
                self.status = "active".into();
            }
            Naive::Payment => self.balance += allowance(&self.plan) - free,
            Naive::Cancel => {
                self.plan = "free".into();
                self.status = "canceled".into();
            }
            Naive::Status(status) => self.status = status.into(),
        }
    }
}

pub async fn run(args: &ScenarioArgs, pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let catalog = shared::platform::config::parse_plans(&args.plans)?;
    let sender = args.signing.sender(&args.intake_url).await?;
    let (source, steps) = script(args.name);
    let run_id = &uuid_suffix();
    let customer = format!("scn_{run_id}");
    let start: DateTime<Utc> = Utc::now() - Span::days(1);
    let http = reqwest::Client::new();

    // The starting point of the nine deliveries: Free, with its allowance.
    if matches!(args.name, Name::NineDeliveries) {
        let spec = spec(
            "plan-assigned",
            &customer,
            Some("free"),
            start - Span::minutes(60),
            None,
            None,
            &format!("{run_id}_start"),
        );
        deliver(&sender, &http, pool, source, &spec).await?;
    }
    let mut naive = NaiveState {
        plan: "free".into(),
        balance: catalog.allowance_of("free").unwrap_or(0),
        status: "-".into(),
    };
    let mut rows = Vec::new();
    let progress = if json_output {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(steps.len() as u64)
    };
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} deliveries applied {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for (n, s) in steps.iter().enumerate() {
        let at = start + Span::minutes(s.at_minutes);
        let object = s.object.map(|o| format!("{o}_{run_id}"));
        let spec = spec(
            s.kind,
            &customer,
            s.plan,
            at,
            object,
            s.status,
            &format!("{run_id}_{}", s.tag),
        );
        let (answer, outcome) = deliver(&sender, &http, pool, s.source, &spec).await?;
        naive.apply(s.naive, &catalog);
        let mut conn = pool.acquire().await?;
        let period = Period::of(ProviderTime::from(at));
        let customer_id = CustomerId::parse(&customer)?;
        let account =
            shared::billing::account::load(&mut conn, s.source, &customer_id, &period, &catalog)
                .await?;
        let (plan, balance, status) = account
            .map(|a| {
                let status = a
                    .subscriptions
                    .first()
                    .map(|x| x.status.clone())
                    .or_else(|| a.payments.first().map(|p| p.status.clone()))
                    .unwrap_or_else(|| "-".into());
                (a.plan, a.balance, status)
            })
            .unwrap_or_else(|| ("free".into(), 0, "-".into()));
        rows.push(json!({
            "n": n + 1, "delivery": format!("{} {}", s.kind, s.object.unwrap_or("")).trim().to_owned(),
            "provider_time": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), "answer": answer, "outcome": outcome,
            "plan": plan, "balance": balance, "status": status,
            "naive_plan": naive.plan, "naive_balance": naive.balance, "naive_status": naive.status,
        }));
        progress.inc(1);
    }
    progress.finish_and_clear();
    let last = rows.last().cloned().unwrap_or_default();
    if json_output {
        crate::emit(&json!({"customer_id": customer, "timeline": rows, "final": last}).to_string());
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

fn spec(
    kind: &str,
    customer: &str,
    plan: Option<&str>,
    at: DateTime<Utc>,
    object: Option<String>,
    status: Option<&str>,
    event_id: &str,
) -> Spec {
    Spec {
        kind: kind.to_owned(),
        customer: customer.to_owned(),
        plan: plan.map(str::to_owned),
        at,
        object_id: object,
        status: status.map(str::to_owned),
        cancel_at_period_end: false,
        event_id: Some(event_id.to_owned()),
        feature: None,
    }
}

/// Sends one delivery and waits (bounded) until the pipeline has finished its event.
async fn deliver(
    sender: &Sender,
    http: &reqwest::Client,
    pool: &PgPool,
    source: &str,
    spec: &Spec,
) -> anyhow::Result<(String, String)> {
    let (id, payload) = sender.build(source, spec)?;
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
