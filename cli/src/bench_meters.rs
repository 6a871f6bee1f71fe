//! `inboxctl bench --meters N`: meter reports (docs/design.md §4.13, §8). N debits of metered
//! customers are accepted with their reports written (`usage::debit`, as the api function
//! does), then every report is sent by `meters::send` — claim, send, record — from concurrent
//! tasks to a fake Stripe meter API served in this process on loopback, which keeps each
//! `identifier` once (a repeat is Stripe's 400 "already exists") and counts the repeats. In a
//! database of its own, removed afterwards; bounded by N and by a deadline.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::net::TcpListener;

use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest};
use shared::domain::retry::RETRY;
use shared::domain::{CustomerId, Period};
use shared::meters::outbox::{self, ReportStatus};
use shared::meters::{self, Meters, Reported};
use shared::platform::secrets::ApiKey;
use shared::providers::stripe::meter::StripeMeter;
use shared::providers::Api;

use crate::bench::{drop_database, fresh_database, percentile, run_concurrently, BenchArgs};
use crate::bench_api::{seed, seed_source, with_bench_plan};
use crate::bench_serve;

/// The meter's event name at the fake.
const METER: &str = "bench_api_calls";
/// Customers the debits are spread over.
const CUSTOMERS: usize = 50;
/// The whole send phase ends by then, whatever is left.
const DEADLINE: Duration = Duration::from_secs(120);

/// What the fake meter saw: each identifier's value, and the repeats it answered.
#[derive(Default)]
struct Held {
    values: Mutex<HashMap<String, i64>>,
    posts: AtomicU64,
    duplicates: AtomicU64,
}

pub async fn run(
    args: &BenchArgs,
    reports: usize,
    server: &str,
    json_output: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (100..=100_000).contains(&reports),
        "--meters must be between 100 and 100000"
    );
    anyhow::ensure!(
        (1..=256).contains(&args.senders),
        "--senders must be between 1 and 256"
    );
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let db = format!("inbox_meterbench_{tag}");
    let result = bench(args, reports, server, &db).await;
    drop_database(server, &db).await;
    let report = result?;
    if json_output {
        crate::output::emit(&report.to_string());
    } else {
        crate::output::emit(&format!(
            "meter reports: {} debits with reports written in {:.2} s ({:.0}/s); {} sent by {} senders in {:.2} s: {:.0} reports/s (p50 {:.2} ms, p99 {:.2} ms per send); the fake meter holds {} identifiers, {} duplicates; {} not sent",
            report["reports"], report["write_secs"].as_f64().unwrap_or_default(),
            report["written_per_sec"].as_f64().unwrap_or_default(), report["sent"],
            report["senders"], report["send_secs"].as_f64().unwrap_or_default(),
            report["reports_per_sec"].as_f64().unwrap_or_default(),
            report["send_p50_ms"].as_f64().unwrap_or_default(),
            report["send_p99_ms"].as_f64().unwrap_or_default(),
            report["held"], report["duplicates"], report["not_sent"],
        ));
    }
    Ok(())
}

async fn bench(args: &BenchArgs, reports: usize, server: &str, db: &str) -> anyhow::Result<Value> {
    let catalog = with_bench_plan(&args.plans)?;
    let sender = args.signing.sender("").await?;
    let source = seed_source(&sender)?;
    let configs = shared::platform::config::parse_sources(&args.signing.sources)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let connections = (args.senders + 2) as u32;
    let pool = fresh_database(
        server,
        db,
        shared::platform::database::pool_options(connections),
        None,
    )
    .await?;
    eprintln!(
        "bench --meters: seeding {CUSTOMERS} customers on '{}'",
        source.name
    );
    let customers = seed(&sender, &source, &configs, &pool, &catalog, CUSTOMERS).await?;

    // The debits, each writing its report in the statement that accepts it.
    let written = Instant::now();
    let items: Vec<(CustomerId, String)> = (0..reports)
        .map(|n| {
            (
                customers[n % customers.len()].clone(),
                format!("meter-bench-{n}"),
            )
        })
        .collect();
    let refused = Arc::new(AtomicU64::new(0));
    let (p, s, r) = (pool.clone(), source.name.clone(), refused.clone());
    run_concurrently(items, args.senders.min(16), move |_, (customer, key)| {
        let (pool, source, refused) = (p.clone(), s.clone(), r.clone());
        async move {
            let request = DebitRequest {
                source: &source,
                customer: &customer,
                key: &key,
                amount: 1,
                period: DebitPeriod::Arrival(Period::current()),
                note: None,
                effects: None,
                meter: Some(METER),
            };
            let accepted = match pool.acquire().await {
                Ok(mut conn) => matches!(
                    usage::debit(&mut conn, &request).await.map(|d| d.debit),
                    Ok(Debit::Accepted { .. })
                ),
                Err(_) => false,
            };
            if !accepted {
                refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await;
    let write_secs = written.elapsed().as_secs_f64();
    anyhow::ensure!(
        refused.load(Ordering::Relaxed) == 0,
        "{} debits were not accepted",
        refused.load(Ordering::Relaxed)
    );
    let ids = outbox::ids_with_status(&pool, ReportStatus::Pending, None).await?;
    anyhow::ensure!(
        ids.len() == reports,
        "{} reports written for {reports} debits",
        ids.len()
    );

    // The fake meter and the dispatcher's meter pointed at it.
    let held = Arc::new(Held::default());
    let addr = serve(held.clone()).await?;
    let http = reqwest::Client::builder()
        .timeout(meters::SEND_TIMEOUT)
        .build()?;
    let api = Api {
        base_url: format!("http://{addr}"),
        key: ApiKey::Known("sk_test_bench_local_only".into()),
        client_id: None,
        http,
        budget: None,
    };
    let meter: Box<dyn shared::providers::meter::Meter> = Box::new(StripeMeter::new(api, METER));
    let meters: Arc<Meters> = Arc::new(
        [(source.name.clone(), METER.to_owned(), meter)]
            .into_iter()
            .collect(),
    );

    let started = Instant::now();
    let sent = Arc::new(AtomicU64::new(0));
    let (p, m, n) = (pool.clone(), meters.clone(), sent.clone());
    let latencies = run_concurrently(ids, args.senders, move |_, id: String| {
        let (pool, meters, sent) = (p.clone(), m.clone(), n.clone());
        async move {
            if started.elapsed() > DEADLINE {
                return;
            }
            let reported = meters::send(&pool, &meters, &id, outbox::SEND_LEASE, &RETRY).await;
            if matches!(reported, Ok(Reported::Sent)) {
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
    .await;
    let send_secs = started.elapsed().as_secs_f64();
    let sent = sent.load(Ordering::Relaxed);
    let not_sent = remaining(&pool).await?;
    let values = held
        .values
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let held_total: i64 = values.values().sum();
    Ok(json!({
        "reports": reports,
        "customers": CUSTOMERS,
        "senders": args.senders,
        "write_secs": write_secs,
        "written_per_sec": reports as f64 / write_secs,
        "sent": sent,
        "send_secs": send_secs,
        "reports_per_sec": sent as f64 / send_secs,
        "send_p50_ms": percentile(&latencies, 0.50),
        "send_p99_ms": percentile(&latencies, 0.99),
        "posts": held.posts.load(Ordering::Relaxed),
        "held": values.len(),
        "held_total": held_total,
        "duplicates": held.duplicates.load(Ordering::Relaxed),
        "not_sent": not_sent,
    }))
}

async fn remaining(pool: &PgPool) -> anyhow::Result<usize> {
    Ok(outbox::ids_with_status(pool, ReportStatus::Pending, None)
        .await?
        .len()
        + outbox::ids_with_status(pool, ReportStatus::Dead, None)
            .await?
            .len())
}

/// Serves the fake meter on a loopback port of the system's choosing, until the process ends.
async fn serve(held: Arc<Held>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding the fake meter to loopback")?;
    let addr = listener.local_addr()?;
    bench_serve::serve(listener, move || held.clone(), answer);
    Ok(addr)
}

/// Stripe's answer to `POST /v1/billing/meter_events`: the event, or for an identifier held
/// already its 400 "An event already exists with identifier …".
async fn answer(
    held: Arc<Held>,
    request: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let respond = |status: u16, body: Value| {
        hyper::Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap_or_default()
    };
    if request.uri().path() != "/v1/billing/meter_events" {
        return respond(
            404,
            json!({"error": {"type": "invalid_request_error", "message": "Unrecognized request URL"}}),
        );
    }
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return respond(400, json!({"error": {"message": "unreadable body"}})),
    };
    held.posts.fetch_add(1, Ordering::Relaxed);
    let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    let id = form.get("identifier").cloned().unwrap_or_default();
    let value: i64 = form
        .get("payload[value]")
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
    let new = {
        let mut values = held.values.lock().unwrap_or_else(|e| e.into_inner());
        values.insert(id.clone(), value).is_none()
    };
    if !new {
        held.duplicates.fetch_add(1, Ordering::Relaxed);
        return respond(
            400,
            json!({"error": {"type": "invalid_request_error",
            "message": format!("An event already exists with identifier {id}.")}}),
        );
    }
    respond(
        200,
        json!({
            "object": "billing.meter_event", "event_name": form.get("event_name"),
            "identifier": id, "livemode": false,
            "created": chrono::Utc::now().timestamp(),
            "payload": {"stripe_customer_id": form.get("payload[stripe_customer_id]"), "value": value.to_string()},
            "timestamp": form.get("timestamp").and_then(|t| t.parse::<i64>().ok()),
        }),
    )
}
