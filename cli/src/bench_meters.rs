//! `inboxctl bench --meters N`: meter reports (docs/design.md §4.13, §8). N debits of metered
//! customers are accepted with their reports written (`usage::debit`, as the api function
//! does), then every report is sent by `meters::send` — claim, send, record — from concurrent
//! tasks to the project's fake Stripe (`provider_fakes::stripe::FakeStripe`, the one the tests
//! use, without its description checks) served in this process on loopback: it keeps each
//! `identifier` once for 24 hours (a repeat is Stripe's 400 "already exists", counted) and
//! replays each `Idempotency-Key`'s first answer. In a database of its own, removed afterwards;
//! bounded by N and by a deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use provider_fakes::stripe::FakeStripe;
use serde_json::{json, Value};
use sqlx::PgPool;

use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest};
use shared::domain::retry::RETRY;
use shared::domain::{CustomerId, Period};
use shared::meters::outbox::{self, ReportStatus};
use shared::meters::{self, Meters, Reported};
use shared::platform::secrets::ApiKey;
use shared::providers::stripe::meter::StripeMeter;
use shared::providers::Api;

use crate::bench::{percentile, run_concurrently, BenchArgs};
use crate::bench_api::{seed_source, with_bench_plan};
use crate::bench_scratch::{with_scratch_database, Scratch, Seed, Seeded};

/// The meter's event name at the fake.
const METER: &str = "bench_api_calls";
/// Customers the debits are spread over.
const CUSTOMERS: usize = 50;
/// The whole send phase ends by then, whatever is left.
const DEADLINE: Duration = Duration::from_secs(120);

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
    let report = with_scratch_database(server, "meter", |db| bench(args, reports, db)).await?;
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

async fn bench(args: &BenchArgs, reports: usize, db: Scratch) -> anyhow::Result<Value> {
    let catalog = with_bench_plan(&args.plans)?;
    let sender = args.signing.sender("").await?;
    let source = seed_source(&sender)?;
    let configs = shared::platform::config::parse_sources(&args.signing.sources)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let connections = (args.senders + 2) as u32;
    let seed = Seed {
        sender: &sender,
        source: &source,
        configs: &configs,
        catalog: &catalog,
        customers: CUSTOMERS,
    };
    let Seeded { pool, customers } = db.seeded(connections, seed).await?;

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
                unit: shared::billing::credits::ALLOWANCE_UNIT,
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

    // The fake Stripe and the dispatcher's meter pointed at it.
    let stripe = FakeStripe::default();
    let server = stripe.serve_unchecked().await;
    let http = reqwest::Client::builder()
        .timeout(meters::SEND_TIMEOUT)
        .build()?;
    let api = Api {
        base_url: server.uri(),
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
    let held = stripe.held();
    let held_total: f64 = stripe.totals().values().sum();
    let (_, duplicates) = stripe.resends();
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
        "posts": stripe.posts(),
        "held": held.len(),
        "held_total": held_total as i64,
        "duplicates": duplicates,
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
