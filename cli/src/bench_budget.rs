//! `inboxctl bench --budget N`: one source's budget of provider API calls under load
//! (docs/design.md §6.7, §8). A Stripe source in test mode, its API the project's fake Stripe
//! (`provider_fakes::stripe`) served in this process with its rate limiter on — Stripe's
//! documented limits for the key's mode, counted per second, a 429 past them — and without its
//! description checks. At once: N thin events signed as Stripe signs them go through the intake
//! in a burst, each read back by the worker (`GET /v1/subscriptions/{id}`); the scheduler runs
//! on its deployed schedule, its reconciliation walking as many events the webhooks never
//! brought in `GET /v1/events`; and debits with meter reports come at a steady pace, handed to
//! the dispatcher as the api function hands them. Every call goes through the real code and the
//! one budget in Postgres. It runs until every event is final and every report sent (or its
//! deadline), then reads what the fake's limiter saw and the rows' own times. In a database
//! and queues of its own, removed afterwards.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{SecondsFormat, Utc};
use provider_fakes::stripe::FakeStripe;
use provider_fakes::stripe::Mode;
use serde_json::{json, Value};
use sqlx::PgPool;

use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest};
use shared::domain::{CustomerId, Period, SourceKind};
use shared::handlers::dispatcher::{self, DispatcherState};
use shared::handlers::intake::IntakeState;
use shared::handlers::scheduler::{self, Audit, SchedulerState};
use shared::handlers::worker::{WorkerSource, WorkerState};
use shared::meters::outbox::MeterReports;
use shared::meters::Meters;
use shared::platform::budget::{Budgets, Lane};
use shared::platform::config::{parse_sources, SourceConfig};
use shared::platform::queue::Queue;
use shared::providers::fixtures::Spec;
use shared::providers::{ApiClient, Sources};

use crate::bench::{
    create_queue, deliver, run_concurrently, spawn_pollers, BenchArgs, Delivery, Polls,
};
use crate::bench_api::with_bench_plan;
use crate::bench_scratch::{with_scratch_database, Scratch, Seed};

/// The source's key in each mode: the mode's prefix makes the budget and the fake both take
/// that mode's limits (docs.stripe.com/keys, docs.stripe.com/rate-limits): the sandbox's by
/// default, the tighter of the two and the one a developer meets first; live mode's with
/// `--live`.
const SANDBOX_KEY: &str = "sk_test_bench_budget_local_only";
const LIVE_KEY: &str = "sk_live_bench_budget_local_only";
/// The meter the debits are reported to: the fake Stripe's `api_calls` meter, whose event
/// summaries the scheduler's meter audit reads.
const METER: &str = "api_calls";
/// Each mode's global limit, as the fake enforces it: "Live mode: 100 operations; Sandbox: 25
/// operations" (docs.stripe.com/rate-limits).
fn limit_per_second(mode: Mode) -> u32 {
    match mode {
        Mode::Live => 100,
        Mode::Sandbox => 25,
    }
}

/// The mode benched: `--live`'s, else the sandbox's.
fn mode_of(args: &BenchArgs) -> Mode {
    match args.live {
        true => Mode::Live,
        false => Mode::Sandbox,
    }
}
/// The customers the debits are spread over, and those the thin events' subscriptions are.
const METERED: usize = 20;
const THIN_CUSTOMERS: usize = 500;
/// The scheduler's deployed schedule (template.yaml, `ScheduleRate`'s default).
const SCHEDULE: Duration = Duration::from_secs(60);
/// Concurrent intake requests, and worker invocations (the event source mapping's).
const CONCURRENCY: usize = 8;
/// Dispatcher pollers on the reports' queue.
const DISPATCHERS: usize = 2;

/// Ids of the bench's events, so that its counts find them and nothing else.
const THIN_PREFIX: &str = "evt_test_bench_thin_";
const MISSED_PREFIX: &str = "evt_bench_missed_";

pub async fn run(
    args: &BenchArgs,
    events: usize,
    server: &str,
    json_output: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (10..=100_000).contains(&events),
        "--budget must be between 10 and 100000"
    );
    anyhow::ensure!(
        (1..=10_000).contains(&args.debits),
        "--debits must be between 1 and 10000"
    );
    let report = with_scratch_database(server, "budget", |db| bench(args, events, db)).await?;
    if json_output {
        crate::output::emit(&report.to_string());
    } else {
        let f = |v: &Value| v.as_f64().unwrap_or_default();
        let r = &report["meter_reports"];
        crate::output::emit(&format!(
            "read budget: {} thin events, {} applied ({} final); {} events the webhooks missed, {} stored by reconciliation in {} scheduler runs; \
             the fake Stripe saw {} requests, {} over its limit, at most {} in one second (limit {}/s, busiest endpoint {}); \
             {} meter reports of {} sent, {} on their first claim, from debit to Stripe's receipt p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; \
             total {:.1} s",
            report["thin_events"], report["thin_applied"], report["thin_final"],
            report["missed_events"], report["reconciled"], report["scheduler_runs"],
            report["fake"]["requests"], report["fake"]["over_limit"],
            report["fake"]["peak_per_second"], report["fake"]["limit_per_second"],
            report["fake"]["peak_endpoint"],
            r["sent"], r["written"], r["sent_first_claim"],
            f(&r["p50_ms"]), f(&r["p99_ms"]), f(&r["max_ms"]),
            f(&report["total_secs"]),
        ));
    }
    let over = report["fake"]["over_limit"].as_u64().unwrap_or_default();
    anyhow::ensure!(
        over == 0,
        "the fake Stripe refused {over} requests over its limit"
    );
    anyhow::ensure!(
        report["thin_applied"] == report["thin_events"],
        "not every thin event was applied: {}",
        report["thin_statuses"]
    );
    anyhow::ensure!(
        report["meter_reports"]["sent"] == report["meter_reports"]["written"],
        "not every meter report was sent: {}",
        report["meter_reports"]
    );
    Ok(())
}

/// The Stripe source of INBOX_SOURCES (its name and signing secrets), with an API at `base`
/// under the key of `mode`, metered, and the documented default budget of that mode (the key's).
/// In live mode the source takes both modes' events (`livemode` unset), so that the seed's
/// deliveries, the fixtures' test-mode ones, put the metered customers on the plan as in the
/// sandbox; the bench's own events say live mode.
fn budgeted_source(
    sender: &crate::send::Sender,
    base: &str,
    mode: Mode,
) -> anyhow::Result<SourceConfig> {
    let (key, livemode) = match mode {
        Mode::Live => (LIVE_KEY, Value::Null),
        Mode::Sandbox => (SANDBOX_KEY, json!(false)),
    };
    let stripe = sender
        .sources()
        .iter()
        .find(|s| s.kind == SourceKind::Stripe)
        .context("INBOX_SOURCES has no Stripe source")?;
    let entry = json!([{
        "name": stripe.name, "kind": "stripe", "secrets": stripe.secrets,
        "api_key": key, "api_base_url": base, "livemode": livemode,
        "meter": {"event_name": METER},
    }]);
    let configs = parse_sources(&entry.to_string()).map_err(|e| anyhow::anyhow!("{e}"))?;
    shared::providers::check_sources(&configs)?;
    configs.into_iter().next().context("no source parsed")
}

/// Subscription `sub` of `customer` on the pro price, as the fixtures write it, changed `at`,
/// in live mode or not (an event of the other mode is stored and ignored).
fn subscription_event(
    sender: &crate::send::Sender,
    source: &str,
    (customer, sub, event_id): (&str, &str, &str),
    at: chrono::DateTime<Utc>,
    live: bool,
) -> anyhow::Result<Value> {
    let spec = Spec {
        kind: "subscription".into(),
        customer: customer.into(),
        plan: Some("price_pro".into()),
        at,
        object_id: Some(sub.into()),
        event_id: Some(event_id.into()),
        ..Default::default()
    };
    let mut event = sender.build(source, &spec)?.1;
    event["livemode"] = json!(live);
    event["data"]["object"]["livemode"] = json!(live);
    Ok(event)
}

/// A thin event for a change of `sub` (`v1.customer.subscription.updated`, a `v2.core.event`
/// that names its related object and carries none of it; docs.stripe.com/event-destinations).
fn thin_event(id: &str, sub: &str, at: chrono::DateTime<Utc>, twin: &str, live: bool) -> Value {
    json!({
        "id": id, "object": "v2.core.event", "type": "v1.customer.subscription.updated",
        "livemode": live, "created": at.to_rfc3339_opts(SecondsFormat::Millis, true),
        "context": null, "reason": null,
        "related_object": {"id": sub, "type": "subscription", "url": format!("/v1/subscriptions/{sub}")},
        "snapshot_event": twin,
    })
}

async fn bench(args: &BenchArgs, events: usize, db: Scratch) -> anyhow::Result<Value> {
    let catalog = with_bench_plan(&args.plans)?;
    let sender = args.signing.sender("").await?;

    // The fake Stripe in the mode benched: its limiter in front of the read and meter routes.
    let mode = mode_of(args);
    let live = mode == Mode::Live;
    let stripe = FakeStripe::default();
    stripe.in_mode(mode);
    let api = stripe.serve_unchecked().await;
    api.reset().await;
    stripe.mount(&api).await;
    let source = budgeted_source(&sender, &api.uri(), mode)?;

    let seed = Seed {
        sender: &sender,
        source: &source,
        configs: std::slice::from_ref(&source),
        catalog: &catalog,
        customers: METERED - 1,
    };
    let seeded = db.seeded((CONCURRENCY * 3 + 8) as u32, seed).await?;
    let (pool, metered) = (seeded.pool, seeded.customers);

    // The account's objects and events: each thin event's subscription, and the events the
    // webhooks never brought, spread over the walk's first three days.
    eprintln!("bench --budget: preparing {events} thin events and {events} missed events");
    let now = Utc::now();
    let mut deliveries = Vec::with_capacity(events);
    for n in 0..events {
        let (customer, sub) = (
            format!("bench_thin_{}", n % THIN_CUSTOMERS),
            format!("sub_bench_thin_{n}"),
        );
        let at = now - chrono::Duration::seconds((n % 600) as i64 + 1);
        let twin = format!("evt_bench_twin_{n}");
        let object = subscription_event(&sender, &source.name, (&customer, &sub, &twin), at, live)?;
        stripe.holds(object["data"]["object"].clone());
        let id = format!("{THIN_PREFIX}{n:06}");
        let signed = sender.sign(&source.name, &id, &thin_event(&id, &sub, at, &twin, live))?;
        deliveries.push(Delivery {
            source: source.name.clone(),
            headers: signed.headers,
            body: signed.body,
        });
    }
    let first = shared::reconcile::FIRST_LOOKBACK.as_secs_f64() - 120.0;
    let span = first - shared::reconcile::LAG.as_secs_f64() - 120.0;
    for n in 0..events {
        let back = first - span * n as f64 / events as f64;
        let at = now - chrono::Duration::milliseconds((back * 1000.0) as i64);
        let event = subscription_event(
            &sender,
            &source.name,
            (
                &format!("bench_missed_{}", n % THIN_CUSTOMERS),
                &format!("sub_bench_missed_{n}"),
                &format!("{MISSED_PREFIX}{n:06}"),
            ),
            at,
            live,
        )?;
        stripe.has_event(event);
    }

    let sqs = aws_sdk_sqs::Client::new(&shared::platform::queue::sdk_config().await);
    let events_url = create_queue(&sqs, &format!("inbox-budgetbench-{}", db.tag)).await?;
    let outbox_url = create_queue(&sqs, &format!("inbox-budgetbench-reports-{}", db.tag)).await;
    let outcome = match outbox_url {
        Ok(outbox_url) => {
            let queues = (&sqs, events_url.as_str(), outbox_url.as_str());
            let outcome = measure(
                args, events, &source, &catalog, &pool, queues, deliveries, &metered, &stripe,
            )
            .await;
            let _ = sqs.delete_queue().queue_url(&outbox_url).send().await;
            outcome
        }
        Err(e) => Err(e),
    };
    let _ = sqs.delete_queue().queue_url(&events_url).send().await;
    pool.close().await;
    outcome
}

/// What the run did, read when it is quiet.
#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &BenchArgs,
    events: usize,
    source: &SourceConfig,
    catalog: &shared::domain::Catalog,
    pool: &PgPool,
    (sqs, events_url, outbox_url): (&aws_sdk_sqs::Client, &str, &str),
    deliveries: Vec<Delivery>,
    metered: &[CustomerId],
    stripe: &FakeStripe,
) -> anyhow::Result<Value> {
    let configs = std::slice::from_ref(source);
    let http = reqwest::Client::builder()
        .timeout(shared::meters::SEND_TIMEOUT)
        .build()?;
    // One budget for every function, in Postgres, as deployed: reads for the worker and the
    // scheduler, the meter reports' lane for the dispatcher.
    let budgets = Budgets::new(pool.clone());
    let reads = ApiClient::budgeted(&http, budgets.clone(), Lane::Reads);
    let meter_lane = ApiClient::budgeted(&http, budgets, Lane::Meter);
    let events_queue = || Queue::new(sqs.clone(), events_url);
    let outbox = || Queue::new(sqs.clone(), outbox_url);

    let mut instances = Vec::with_capacity(CONCURRENCY);
    for _ in 0..CONCURRENCY {
        let verifiers = Sources::build(configs, Duration::from_secs(300), reqwest::Client::new())
            .map_err(|e| anyhow::anyhow!(e))?;
        instances.push(Arc::new(IntakeState::new(
            pool.clone(),
            events_queue(),
            verifiers,
        )));
    }
    let instances = Arc::new(instances);
    let mut worker = WorkerState::new(
        pool.clone(),
        [(
            source.name.clone(),
            WorkerSource::from_config(source, &reads),
        )]
        .into_iter()
        .collect(),
        catalog.clone(),
    );
    worker.events = Some(events_queue());
    let worker = Arc::new(worker);
    let mut dispatcher = DispatcherState::new(
        pool.clone(),
        shared::effects::sinks::Sinks::resolve(&[]).await?,
    );
    dispatcher.meters = Meters::build(configs, &meter_lane);
    let dispatcher = Arc::new(dispatcher);
    let scheduler = Arc::new(SchedulerState {
        pool: pool.clone(),
        queue: events_queue(),
        reconcilers: shared::reconcile::reconcilers(configs, &reads),
        sources: vec![source.name.clone()],
        retention: Duration::from_secs(shared::platform::config::DEFAULT_RETENTION_DAYS * 86_400),
        effects: None,
        outbox: Some(outbox()),
        budget: Duration::from_secs(50),
        database: None,
        audit: Some(Audit {
            meters: Meters::build(configs, &reads),
            ..Audit::new(shared::audit::sources_of(configs), catalog.clone())
        }),
    });

    // Bounded: five times what the budget needs for the reads alone, and five minutes more.
    let started = Instant::now();
    let deadline = started + Duration::from_secs(300) + Duration::from_millis(events as u64 * 200);
    let stop = Arc::new(AtomicBool::new(false));
    eprintln!(
        "bench --budget: {events} thin events, a reconciliation and {} debits at once",
        args.debits
    );

    let last_work = Arc::new(std::sync::Mutex::new((started, crate::bench::ticks())));
    let pollers = spawn_pollers(
        &worker,
        sqs,
        events_url,
        CONCURRENCY,
        deadline,
        Polls::Long,
        (stop.clone(), 1),
        last_work,
    );
    let dispatchers: Vec<_> = (0..DISPATCHERS)
        .map(|_| {
            let (sqs, url, state, stop) = (
                sqs.clone(),
                outbox_url.to_owned(),
                dispatcher.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                    // Receives that do not wait (the local SQS server answers a long poll only
                    // once it holds a batch of 10, where SQS answers as soon as it has a
                    // message): a report's wait is then the pipeline's, not the server's.
                    let pumped = shared::dev::lambda_triggers::pump_once(&sqs, &url, 0, |event| {
                        let state = state.clone();
                        async move { Ok(dispatcher::handle_batch(&state, event).await) }
                    })
                    .await;
                    match pumped {
                        Ok(r) if r.received > 0 => {}
                        Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        Err(e) => {
                            eprintln!("bench --budget: {e:#}");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    }
                }
            })
        })
        .collect();
    // The scheduler on its schedule, its first run at once (its run is not `Send`: it runs
    // beside the rest on this task).
    let runs = async {
        let mut runs = Vec::new();
        loop {
            let tick = Instant::now();
            runs.push(scheduler::run(&scheduler).await);
            while tick.elapsed() < SCHEDULE {
                if stop.load(Ordering::SeqCst) || Instant::now() >= deadline {
                    return runs;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    // The debits, at a steady pace over the time the budget needs for the reads.
    let debiting = {
        let (pool, source_name, customers, outbox) = (
            pool.clone(),
            source.name.clone(),
            metered.to_vec(),
            outbox(),
        );
        let limit = limit_per_second(mode_of(args));
        let (count, per_second) = (args.debits, f64::from(limit) * 0.8);
        let every = Duration::from_secs_f64(events as f64 / per_second / count as f64);
        tokio::spawn(async move {
            let mut refused = 0u64;
            for n in 0..count {
                tokio::time::sleep(every).await;
                let customer = &customers[n % customers.len()];
                let key = format!("budget-bench-{n}");
                let request = DebitRequest {
                    source: &source_name,
                    customer,
                    key: &key,
                    amount: 1,
                    period: DebitPeriod::Arrival(Period::current()),
                    note: None,
                    effects: None,
                    meter: Some(METER),
                    unit: shared::billing::credits::ALLOWANCE_UNIT,
                };
                let debited = match pool.acquire().await {
                    Ok(mut conn) => usage::debit(&mut conn, &request).await.ok(),
                    Err(_) => None,
                };
                match debited {
                    Some(d) if matches!(d.debit, Debit::Accepted { .. }) => {
                        // As the api function hands it over, after the commit.
                        if let Some(id) = d.reported {
                            let ids = std::slice::from_ref(&id);
                            let _ = shared::platform::queued::enqueue_or_unmark::<MeterReports>(
                                &pool, &outbox, ids,
                            )
                            .await;
                        }
                    }
                    _ => refused += 1,
                }
            }
            refused
        })
    };

    let work = async {
        // The burst: every thin event through the intake.
        let delivered = Arc::new(AtomicU64::new(0));
        let intake_secs = {
            let (instances, delivered) = (instances.clone(), delivered.clone());
            run_concurrently(deliveries, CONCURRENCY, move |slot, d| {
                let (state, delivered) = (instances[slot].clone(), delivered.clone());
                async move {
                    deliver(&state, d).await;
                    delivered.fetch_add(1, Ordering::Relaxed);
                }
            })
            .await;
            started.elapsed().as_secs_f64()
        };
        let refused_debits = debiting.await.unwrap_or(u64::MAX);

        // Quiet: every event of the bench final, every report sent or dead.
        let quiet = async {
            while Instant::now() < deadline {
                let (thin, missed, open_reports) = progress(pool, &source.name).await?;
                if thin == events as i64 && missed == events as i64 && open_reports == 0 {
                    return anyhow::Ok(true);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(false)
        }
        .await;
        let total_secs = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::SeqCst);
        for p in pollers.into_iter().chain(dispatchers) {
            let _ = p.await;
        }
        let delivered = delivered.load(Ordering::Relaxed);
        anyhow::Ok((intake_secs, refused_debits, quiet?, total_secs, delivered))
    };
    let (runs, worked) = tokio::join!(runs, work);
    let (intake_secs, refused_debits, quiet, total_secs, delivered) = worked?;
    anyhow::ensure!(refused_debits == 0, "{refused_debits} debits were refused");

    let seen = stripe.rate_seen();
    let statuses = thin_statuses(pool, &source.name).await?;
    let applied = statuses
        .iter()
        .find(|(s, _)| s == "applied")
        .map_or(0, |(_, n)| *n);
    let (thin_final, reconciled, _) = progress(pool, &source.name).await?;
    let (taken, refused): (i64, i64) = sqlx::query_as(
        "SELECT taken, refused FROM api_budgets WHERE source = $1 AND endpoint = ''",
    )
    .bind(&source.name)
    .fetch_optional(pool)
    .await?
    .unwrap_or_default();
    let reconciliation: Vec<Value> = runs
        .iter()
        .flat_map(|r| &r.reconciliation)
        .map(|r| {
            json!({"read": r.read, "stored_new": r.stored_new, "stopped_early": r.stopped_early,
                   "behind_secs": r.behind_secs, "error": r.error})
        })
        .collect();
    Ok(json!({
        "source": source.name,
        "mode": "test",
        "quiet": quiet,
        "thin_events": events,
        "delivered": delivered,
        "intake_secs": intake_secs,
        "thin_applied": applied,
        "thin_final": thin_final,
        "thin_statuses": statuses.into_iter().map(|(s, n)| (s, json!(n))).collect::<serde_json::Map<String, Value>>(),
        "missed_events": events,
        "reconciled": reconciled,
        "scheduler_runs": runs.len(),
        "scheduler_errors": runs.iter().map(|r| r.errors.len()).sum::<usize>(),
        "reconciliation": reconciliation,
        "fake": {
            "requests": seen.requests,
            "over_limit": seen.over_limit,
            "peak_per_second": seen.peak_per_second,
            "peak_endpoint": seen.peak_endpoint,
            "mode": match mode_of(args) { Mode::Live => "live", Mode::Sandbox => "sandbox" },
            "limit_per_second": limit_per_second(mode_of(args)),
            "endpoint_limit_per_second": 25,
            "meter_events_taken": stripe.events().len(),
        },
        "budget": {
            "per_second": shared::providers::api_limit(source).per_second,
            "burst": shared::providers::api_limit(source).burst,
            "reserved": shared::providers::api_limit(source).reserved,
            "taken": taken,
            "refused_takes": refused,
        },
        "meter_reports": reports(pool).await?,
        "debits": args.debits,
        "total_secs": total_secs,
    }))
}

/// The bench's thin events that are final, the missed events reconciliation stored that are
/// final, and the meter reports not sent yet (pending).
async fn progress(pool: &PgPool, source: &str) -> anyhow::Result<(i64, i64, i64)> {
    let (thin, missed): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE dedupe_key LIKE 'evt\\_test\\_bench\\_thin\\_%'),
                count(*) FILTER (WHERE dedupe_key LIKE 'evt\\_bench\\_missed\\_%')
         FROM inbox_events
         WHERE source = $1 AND status IN ('applied', 'ignored', 'unprocessable', 'dead')",
    )
    .bind(source)
    .fetch_one(pool)
    .await?;
    let open: i64 =
        sqlx::query_scalar("SELECT count(*) FROM meter_reports WHERE status = 'pending'")
            .fetch_one(pool)
            .await?;
    Ok((thin, missed, open))
}

async fn thin_statuses(pool: &PgPool, source: &str) -> anyhow::Result<Vec<(String, i64)>> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT status, count(*) FROM inbox_events
         WHERE source = $1 AND dedupe_key LIKE 'evt\\_test\\_bench\\_thin\\_%'
         GROUP BY status ORDER BY status",
    )
    .bind(source)
    .fetch_all(pool)
    .await?;
    Ok(rows)
}

/// The meter reports: written, sent, sent on their first claim (never put off), and the time
/// from each one's debit (the report is due at once) to Stripe's receipt.
async fn reports(pool: &PgPool) -> anyhow::Result<Value> {
    let row: (i64, i64, i64, Option<f64>, Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE status = 'sent'),
                count(*) FILTER (WHERE status = 'sent' AND sends = 1),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)::float8),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM sent_at - created_at)::float8),
                max(extract(epoch FROM sent_at - created_at))::float8
         FROM meter_reports",
    )
    .fetch_one(pool)
    .await?;
    let ms = |s: Option<f64>| s.map(|s| s * 1000.0);
    Ok(json!({
        "written": row.0, "sent": row.1, "sent_first_claim": row.2,
        "p50_ms": ms(row.3), "p99_ms": ms(row.4), "max_ms": ms(row.5),
    }))
}
