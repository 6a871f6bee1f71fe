//! `inboxctl bench --api`: the app API's reads, feature checks, credits reads and debits
//! through the api function's handler against the same library calls run raw (the ceiling),
//! at concurrency 4 and 16, with a hot account (every debit on one customer) beside them
//! (docs/design.md §8, docs/api.md). In a database of its own, removed afterwards; every phase
//! is bounded by `--requests`; loopback only. The accounts are seeded as the pipeline makes
//! them: signed fixture deliveries, verified and stored, then applied by the worker's handler
//! in process; their credit grants as the worker's credits statements store them.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use serde_json::{json, Map, Value};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions, PgConnection, PgPool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest};
use shared::billing::{account, credits_read};
use shared::domain::Catalog;
use shared::domain::{CustomerId, Period};
use shared::handlers::api::{self, ApiState};
use shared::handlers::worker::{WorkerSource, WorkerState};
use shared::platform::api_keys::{self, KeyEntry, Keys, Scope};
use shared::platform::config::{parse_plans, parse_sources, SourceConfig};
use shared::platform::db::Held;
use shared::providers::fixtures::{self, Spec};
use shared::providers::Sources;

use crate::bench::{
    drop_database, fresh_database, percentile, round_trip_ms, run_concurrently, through, BenchArgs,
    CpuMeter, StatementCounter,
};
use crate::delay::DelayProxy;

/// The bench-only catalog entry the seeded accounts are on: an allowance no phase can spend,
/// so that every debit is accepted and the phases measure the same work throughout, and the
/// features a feature check finds allowed.
const BENCH_PLAN_KEY: &str = "price_bench_api";
pub(crate) const BENCH_ALLOWANCE: i64 = 1_000_000_000;
/// The feature each check asks for: one the bench plan gives.
const BENCH_FEATURE: &str = "sso";
/// The concurrent callers of each level: as many api function instances, each with its own
/// held connection, against as many raw connections.
const LEVELS: [usize; 2] = [4, 16];
/// Operations of each kind counted on the wire (after a warm-up that opens the connection
/// and prepares the statements).
const WIRE_OPS: usize = 50;
/// The key the bench's api instances accept (a local, throwaway value: only its hash is kept).
const BENCH_KEY: &str = "bik_bench_local_only_read_and_usage";

/// What a phase works on: the request through the handler, or the same call's values raw.
enum Op {
    Read(CustomerId),
    /// A feature check: the customer and the feature's key.
    Feature(CustomerId, &'static str),
    /// The account's credits (`GET …/credits`, as of the store's clock).
    Credits(CustomerId),
    Debit(CustomerId, String),
    /// A debit of [`SPANNING_DEBIT`] on an account whose allowance is spent and whose credit
    /// packs hold [`SPANNING_PACK`] each: it takes from two grants.
    SpanningDebit(CustomerId, String),
}

/// A debit that spans grants: packs of 2, debits of 3, so that each takes from two packs
/// (2 + 1, then 1 + 2) under the account and unit's lock (docs/design.md §4.14).
const SPANNING_DEBIT: i64 = 3;
const SPANNING_PACK: i64 = 2;

/// The phases of each level, by the name the report gives them.
const PHASES: [&str; 5] = ["read", "feature", "credits", "debit", "hot_debit"];
/// The grants each seeded account holds, and the transactions of each grant, for the credits
/// read: a customer with a few grants, each partly spent.
const BENCH_GRANTS: i32 = 3;
const BENCH_TRANSACTIONS: i32 = 4;

pub async fn run(
    args: &BenchArgs,
    server: &str,
    counter: &StatementCounter,
    json_output: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (100..=100_000).contains(&args.requests),
        "--requests must be between 100 and 100000"
    );
    anyhow::ensure!(
        (1..=10_000).contains(&args.customers),
        "--customers must be between 1 and 10000 with --api"
    );
    anyhow::ensure!(
        (0.0..=1000.0).contains(&args.pg_delay_ms),
        "--pg-delay-ms must be between 0 and 1000"
    );
    let catalog = with_bench_plan(&args.plans)?;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let db = format!("inbox_apibench_{tag}");
    let result = bench(args, server, counter, &catalog, &db).await;
    drop_database(server, &db).await;
    let report = result?;
    if json_output {
        crate::output::emit(&report.to_string());
    } else {
        crate::output::emit(&text(&report));
    }
    Ok(())
}

/// The configured catalog with the bench's own plan added (`--plans` is left as it is for
/// everything else: the seeded customers name only this key).
pub(crate) fn with_bench_plan(plans: &str) -> anyhow::Result<Catalog> {
    parse_plans(plans)?;
    let mut entries: Map<String, Value> =
        serde_json::from_str(plans).context("INBOX_PLANS is not a JSON object")?;
    entries.insert(
        BENCH_PLAN_KEY.into(),
        json!({"plan": "bench_api", "monthly_allowance": BENCH_ALLOWANCE,
               "features": {BENCH_FEATURE: true, "seats": 20, "export": "csv"}}),
    );
    Ok(parse_plans(&Value::Object(entries).to_string())?)
}

async fn bench(
    args: &BenchArgs,
    server: &str,
    counter: &StatementCounter,
    catalog: &Catalog,
    db: &str,
) -> anyhow::Result<Value> {
    let sender = args.signing.sender("").await?;
    let source = seed_source(&sender)?;
    let configs = parse_sources(&args.signing.sources).map_err(|e| anyhow::anyhow!("{e}"))?;
    let pool = fresh_database(
        server,
        db,
        shared::platform::database::pool_options(4),
        None,
    )
    .await?;
    eprintln!(
        "bench --api: seeding {} customers on '{}' (and a hot one)",
        args.customers, source.name
    );
    let customers = seed(&sender, &source, &configs, &pool, catalog, args.customers).await?;
    seed_credits(&pool, &source.name, &customers, args.credit_debits).await?;
    let hot = customers.last().context("no customer was seeded")?.clone();
    let spread = &customers[..customers.len() - 1];

    // The measured phases' connections go through the delay proxy when there is one.
    let proxy = crate::bench::delay_proxy(server, args.pg_delay_ms)?;
    let via = proxy.as_ref().map(DelayProxy::addr);
    let direct: PgConnectOptions = server.parse::<PgConnectOptions>()?.database(db);
    let options = through(direct.clone(), via);
    let round_trip = round_trip_ms(options.clone()).await?;

    let sources: Vec<_> = configs.iter().map(|s| (s.name.clone(), s.kind)).collect();
    let instance = |options: PgConnectOptions| ApiState {
        conn: Held::new(options),
        pool: pool.clone(),
        sources: sources.clone(),
        fold_sources: shared::audit::sources_of(&configs),
        catalog: catalog.clone(),
        keys: Keys::new(&[KeyEntry {
            name: "bench".into(),
            sha256: api_keys::hash(BENCH_KEY),
            scopes: vec![Scope::Read, Scope::Usage],
        }]),
        effects: None,
        events: None,
        outbox: None,
        meters: Default::default(),
        silent_hours: shared::platform::config::DEFAULT_SILENT_HOURS,
        console_base: String::new(),
        engine_room: None,
        clock: api::Clock::System,
    };
    let period = Period::current();
    let mut levels = Vec::new();
    for concurrency in LEVELS {
        eprintln!("bench --api: concurrency {concurrency}");
        let instances: Vec<Arc<ApiState>> = (0..concurrency)
            .map(|_| Arc::new(instance(options.clone())))
            .collect();
        let mut raw = Vec::with_capacity(concurrency);
        for _ in 0..concurrency {
            raw.push(Mutex::new(options.connect().await?));
        }
        let raw = Arc::new(raw);
        let instances = Arc::new(instances);
        // Each instance and raw connection opened and its statements prepared before timing.
        let warm = format!("warm-c{concurrency}");
        for (n, state) in instances.iter().enumerate() {
            let id = format!("{warm}-api-{n}");
            for op in [
                Op::Read(hot.clone()),
                Op::Credits(hot.clone()),
                Op::Debit(hot.clone(), id),
            ] {
                anyhow::ensure!(
                    through_handler(state, &source.name, op).await,
                    "a warm-up request through the api handler failed"
                );
            }
        }
        for (n, conn) in raw.iter().enumerate() {
            let id = format!("{warm}-raw-{n}");
            let mut conn = conn.lock().await;
            for op in [
                Op::Read(hot.clone()),
                Op::Credits(hot.clone()),
                Op::Debit(hot.clone(), id),
            ] {
                raw_call(&mut conn, &source.name, &period, catalog, op).await?;
            }
        }

        // The backends serving each side, whose CPU time is the phase's Postgres share.
        let mut api_backends = Vec::with_capacity(concurrency);
        for state in instances.iter() {
            let mut held = state.conn.lock().await;
            api_backends.push(backend_pid(held.get().await?).await?);
        }
        let mut raw_backends = Vec::with_capacity(concurrency);
        for conn in raw.iter() {
            raw_backends.push(backend_pid(&mut *conn.lock().await).await?);
        }
        let ops = |kind: &str, side: &str| -> Vec<Op> {
            (0..args.requests)
                .map(|n| {
                    let customer = match kind {
                        "hot_debit" => hot.clone(),
                        _ => spread[n % spread.len()].clone(),
                    };
                    match kind {
                        "read" => Op::Read(customer),
                        "feature" => Op::Feature(customer, BENCH_FEATURE),
                        "credits" => Op::Credits(customer),
                        _ => Op::Debit(customer, format!("c{concurrency}-{kind}-{side}-{n}")),
                    }
                })
                .collect()
        };
        let mut level = json!({"concurrency": concurrency});
        for kind in PHASES {
            // Half of each side's operations, then the other half in the reverse order (raw,
            // api, api, raw), each on its own connections: a drift of the machine or of the
            // tables during the phase weighs on both sides alike.
            let (mut raw_ops, mut api_ops) = (ops(kind, "raw"), ops(kind, "api"));
            let (raw_rest, api_rest) = (
                raw_ops.split_off(raw_ops.len() / 2),
                api_ops.split_off(api_ops.len() / 2),
            );
            let on_raw = |ops| {
                raw_phase(
                    (counter, &raw_backends),
                    (raw.clone(), &source.name, &period, catalog),
                    ops,
                    concurrency,
                )
            };
            let on_api = |ops| {
                api_phase(
                    (counter, &api_backends),
                    (instances.clone(), &source.name),
                    ops,
                    concurrency,
                )
            };
            let raw_first = on_raw(raw_ops).await;
            let api_first = on_api(api_ops).await;
            let api_second = on_api(api_rest).await;
            let raw_second = on_raw(raw_rest).await;
            let (api_phase, raw_phase) = (
                api_first.and(api_second).report(),
                raw_first.and(raw_second).report(),
            );
            let ratio = api_phase["per_sec"].as_f64().unwrap_or(0.0)
                / raw_phase["per_sec"]
                    .as_f64()
                    .unwrap_or(0.0)
                    .max(f64::MIN_POSITIVE);
            level[kind] = json!({"api": api_phase, "raw": raw_phase, "ratio": ratio});
        }
        levels.push(level);
    }
    drop(proxy);

    eprintln!("bench --api: round trips on the wire");
    let wire = wire_round_trips(
        server,
        direct,
        instance,
        (&source.name, &period, catalog),
        (spread, &hot),
    )
    .await?;
    let used = account::snapshot(
        &mut *pool.acquire().await?,
        &source.name,
        &hot,
        &period,
        catalog,
    )
    .await?
    .map(|s| s.used);
    Ok(json!({
        "requests": args.requests,
        "credit_debits": args.credit_debits,
        "customers": spread.len(),
        "source": source.name,
        "hot_customer": hot.as_str(),
        "hot_used": used,
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "pg_delay_ms": args.pg_delay_ms,
        "pg_round_trip_ms": round_trip,
        "levels": levels,
        "round_trips": wire,
    }))
}

/// The source the accounts are seeded on: Stripe when it is configured (its signing needs only
/// the source's secret), else the first the bench can sign for.
pub(crate) fn seed_source(sender: &crate::send::Sender) -> anyhow::Result<SourceConfig> {
    let usable: Vec<&SourceConfig> = sender
        .sources()
        .iter()
        .filter(|s| sender.can_sign(s.kind))
        .collect();
    usable
        .iter()
        .find(|s| s.kind == shared::domain::SourceKind::Stripe)
        .or(usable.first())
        .map(|s| (*s).clone())
        .context("INBOX_SOURCES has no source this bench can sign for")
}

/// `count` customers and one more (the hot account) on the bench plan: for each, the
/// provider's first fixture kind (a subscription, or Kinde's plan assignment) naming the
/// bench plan, signed, verified and stored as the intake stores it, then applied by the
/// worker's handler in batches of 10 as the event source mapping hands them over. Checks
/// that every customer came out on the plan with its allowance.
pub(crate) async fn seed(
    sender: &crate::send::Sender,
    source: &SourceConfig,
    configs: &[SourceConfig],
    pool: &PgPool,
    catalog: &Catalog,
    count: usize,
) -> anyhow::Result<Vec<CustomerId>> {
    let verifiers = Sources::build(configs, Duration::from_secs(300), reqwest::Client::new())
        .map_err(|e| anyhow::anyhow!(e))?;
    let verifier = verifiers
        .get(&source.name)
        .context("the seed source is not configured")?;
    let kind = fixtures::kinds(source.kind)[0];
    let mut ids = Vec::with_capacity(count + 1);
    let mut customers = Vec::with_capacity(count + 1);
    for n in 0..=count {
        let customer = match n {
            n if n == count => "bench_api_hot".to_owned(),
            n => format!("bench_api_{n}"),
        };
        let spec = Spec {
            kind: kind.to_owned(),
            customer: customer.clone(),
            plan: Some(BENCH_PLAN_KEY.to_owned()),
            at: Utc::now(),
            ..Default::default()
        };
        let (id, payload) = sender.build(&source.name, &spec)?;
        let signed = sender.sign(&source.name, &id, &payload)?;
        let headers: http::HeaderMap = signed
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.parse::<http::HeaderName>().ok()?, v.parse().ok()?)))
            .collect();
        let verified = verifier
            .verify(&headers, &signed.body, Utc::now())
            .await
            .map_err(|e| anyhow::anyhow!("a seed delivery does not verify: {e}"))?;
        let kept = shared::handlers::intake::kept_headers(&headers);
        let stored = shared::inbox::store::store_verified(
            pool,
            &source.name,
            &signed.body,
            &verified,
            shared::inbox::store::Origin::Delivery(&kept),
        )
        .await
        .map_err(|e| anyhow::anyhow!("storing a seed event: {e}"))?;
        ids.push(stored.event_id);
        customers.push(CustomerId::parse(&customer).map_err(|e| anyhow::anyhow!("{e}"))?);
    }
    let worker = WorkerState::new(
        pool.clone(),
        configs
            .iter()
            .map(|s| (s.name.clone(), WorkerSource::from(s.kind)))
            .collect(),
        catalog.clone(),
    );
    for chunk in ids.chunks(10) {
        let messages: Vec<aws_sdk_sqs::types::Message> = chunk
            .iter()
            .map(|id| {
                aws_sdk_sqs::types::Message::builder()
                    .message_id(format!("seed-{id}"))
                    .body(shared::platform::queue::message_body(*id))
                    .build()
            })
            .collect();
        let event = shared::dev::lambda_triggers::sqs_event(&messages, "bench-api");
        let answer = shared::handlers::worker::handle_batch(&worker, event).await;
        anyhow::ensure!(
            answer.batch_item_failures.is_empty(),
            "the worker failed seed events"
        );
    }
    let period = Period::current();
    let mut conn = pool.acquire().await?;
    for customer in &customers {
        let snapshot = account::snapshot(&mut conn, &source.name, customer, &period, catalog)
            .await?
            .with_context(|| format!("seeded customer {customer} has no account"))?;
        anyhow::ensure!(
            snapshot.allowance == BENCH_ALLOWANCE,
            "seeded customer {customer} is on '{}' with {} (the bench plan grants {BENCH_ALLOWANCE})",
            snapshot.plan,
            snapshot.allowance
        );
    }
    Ok(customers)
}

/// [`BENCH_GRANTS`] Stripe credit grants for each customer, each with [`BENCH_TRANSACTIONS`]
/// transactions (its `credits_granted`, then applications), as the worker's credits
/// statements store them, so the credits read folds a realistic account; and `debits`
/// accepted debits of 1 in the grants' unit (no allowance covers it), each of which reached
/// the grants, as `inbox_debit` stores them.
async fn seed_credits(
    pool: &PgPool,
    source: &str,
    customers: &[CustomerId],
    debits: usize,
) -> anyhow::Result<()> {
    let ids: Vec<String> = customers.iter().map(|c| c.as_str().to_owned()).collect();
    sqlx::query!(
        r#"
        WITH g AS (
            INSERT INTO credit_grants (source, customer_id, grant_id, origin, unit, scope, amount,
                category, priority, created_at, effective_at, expires_at, version_at,
                version_key, event_id)
            SELECT $1, c, 'credgr_bench_' || c || '_' || n, 'stripe_credit_grant', 'usd',
                   'price_type:metered', 1000 * n, 'paid', 10 * n, inbox_now(), inbox_now(),
                   inbox_now() + interval '365 days', inbox_now(), 'evt_bench_' || c || '_' || n, 0
            FROM unnest($2::text[]) AS c, generate_series(1, $3::int) AS n
            RETURNING grant_id, amount)
        INSERT INTO credit_transactions (source, transaction_id, grant_id, kind, amount,
            effective_at, event_id)
        SELECT $1, 'cbtxn_bench_' || g.grant_id || '_' || t,
               g.grant_id, CASE WHEN t = 1 THEN 'credits_granted' ELSE 'credits_applied' END,
               CASE WHEN t = 1 THEN g.amount ELSE 10 * t END, inbox_now(), 0
        FROM g, generate_series(1, $4::int) AS t
        "#,
        source,
        &ids,
        BENCH_GRANTS,
        BENCH_TRANSACTIONS,
    )
    .execute(pool)
    .await
    .context("seeding credit grants")?;
    sqlx::query!(
        r#"
        INSERT INTO usage_debits (usage_id, source, customer_id, idempotency_key, period,
            period_named, amount, accepted, used, remaining, unit)
        SELECT 'bench_cd_' || c || '_' || n, $1, c, 'bench-cd-' || n,
               to_char(inbox_now() AT TIME ZONE 'UTC', 'YYYY-MM'), false, 1, true, 0, 0, 'usd'
        FROM unnest($2::text[]) AS c, generate_series(1, $3::int) AS n
        ORDER BY c, n
        "#,
        source,
        &ids,
        i32::try_from(debits).context("--credit-debits is too large")?,
    )
    .execute(pool)
    .await
    .context("seeding debits that reached the grants")?;
    Ok(())
}

/// One request through an api instance's handler, as API Gateway hands it over; whether it
/// was answered 200 (and a feature check found the feature allowed).
async fn through_handler(state: &ApiState, source: &str, op: Op) -> bool {
    let check = matches!(op, Op::Feature(..));
    let request = match op {
        Op::Read(customer) => http::Request::builder()
            .method("GET")
            .uri(format!("/v1/accounts/{source}/{customer}"))
            .header("authorization", format!("Bearer {BENCH_KEY}"))
            .body(lambda_http::Body::Empty),
        Op::Feature(customer, key) => http::Request::builder()
            .method("GET")
            .uri(format!("/v1/accounts/{source}/{customer}/features/{key}"))
            .header("authorization", format!("Bearer {BENCH_KEY}"))
            .body(lambda_http::Body::Empty),
        Op::Credits(customer) => http::Request::builder()
            .method("GET")
            .uri(format!("/v1/accounts/{source}/{customer}/credits"))
            .header("authorization", format!("Bearer {BENCH_KEY}"))
            .body(lambda_http::Body::Empty),
        Op::Debit(customer, key) => http::Request::builder()
            .method("POST")
            .uri(format!("/v1/accounts/{source}/{customer}/usage"))
            .header("authorization", format!("Bearer {BENCH_KEY}"))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(lambda_http::Body::from(r#"{"amount":1}"#)),
        Op::SpanningDebit(customer, key) => http::Request::builder()
            .method("POST")
            .uri(format!("/v1/accounts/{source}/{customer}/usage"))
            .header("authorization", format!("Bearer {BENCH_KEY}"))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(lambda_http::Body::from(
                json!({"amount": SPANNING_DEBIT}).to_string(),
            )),
    };
    let Ok(request) = request else {
        return false;
    };
    let answer = api::handle(state, request, None).await;
    answer.status() == http::StatusCode::OK
        && (!check
            || matches!(answer.body(), lambda_http::Body::Text(t) if t.contains(r#""allowed":true"#)))
}

/// The same library call the handler makes, on a connection of its own: the ceiling.
async fn raw_call(
    conn: &mut PgConnection,
    source: &str,
    period: &Period,
    catalog: &Catalog,
    op: Op,
) -> anyhow::Result<()> {
    let op_amount = matches!(op, Op::SpanningDebit(..));
    match op {
        Op::Read(customer) => {
            account::snapshot(conn, source, &customer, period, catalog)
                .await?
                .context("a seeded account is missing")?;
        }
        // The handler's call: the account's snapshot, then the feature in it.
        Op::Feature(customer, key) => {
            let snapshot = account::snapshot(conn, source, &customer, period, catalog)
                .await?
                .context("a seeded account is missing")?;
            anyhow::ensure!(
                snapshot.feature(key).0,
                "a seeded account lacks the feature {key}"
            );
        }
        // The handler's call: the one statement, folded into the answer's body.
        Op::Credits(customer) => {
            let read = credits_read::read(conn, source, &customer, None)
                .await?
                .context("a seeded account is missing")?;
            anyhow::ensure!(
                read.view().grants.len() == BENCH_GRANTS as usize,
                "a seeded account lacks its credit grants"
            );
        }
        Op::Debit(customer, key) | Op::SpanningDebit(customer, key) => {
            let amount = match op_amount {
                true => SPANNING_DEBIT,
                false => 1,
            };
            let ask = DebitRequest {
                source,
                customer: &customer,
                key: &key,
                amount,
                // As the handler's body, which names no period.
                period: DebitPeriod::Arrival(period.clone()),
                note: None,
                effects: None,
                meter: None,
                unit: shared::billing::credits::ALLOWANCE_UNIT,
            };
            let debited = usage::debit(conn, &ask).await?;
            anyhow::ensure!(
                matches!(debited.debit, Debit::Accepted { .. }),
                "a raw debit was refused: {:?}",
                debited.debit
            );
        }
    }
    Ok(())
}

/// What one run of a phase measured.
struct Measured {
    ops: usize,
    secs: f64,
    latencies: Vec<Duration>,
    statements: u64,
    failed: u64,
    cpu: Value,
    /// CPU ms per operation of the phase's own Postgres backends (of the others' share).
    postgres_ms_per_op: Option<f64>,
}

impl Measured {
    /// Two runs of one side as one: their operations over their time, their latencies
    /// together, the cores' shares weighted by each run's time (null if either has none).
    fn and(mut self, other: Measured) -> Measured {
        let secs = self.secs + other.secs;
        let weigh = |key: &str, by: f64, of: f64| {
            let (a, b) = (self.cpu[key].as_f64(), other.cpu[key].as_f64());
            a.zip(b).map(|(a, b)| a * by + b * of)
        };
        let by_time = (
            self.secs / secs.max(f64::MIN_POSITIVE),
            other.secs / secs.max(f64::MIN_POSITIVE),
        );
        let ops = self.ops + other.ops;
        let by_ops = (
            self.ops as f64 / ops.max(1) as f64,
            other.ops as f64 / ops.max(1) as f64,
        );
        let cpu = json!({
            // (Two full shares weighed may round to a hair above 1.)
            "busy": weigh("busy", by_time.0, by_time.1).map(|b| b.min(1.0)),
            "ms_per_op": weigh("ms_per_op", by_ops.0, by_ops.1),
            "own_ms_per_op": weigh("own_ms_per_op", by_ops.0, by_ops.1),
            "others_ms_per_op": weigh("others_ms_per_op", by_ops.0, by_ops.1),
        });
        let postgres_ms_per_op = self
            .postgres_ms_per_op
            .zip(other.postgres_ms_per_op)
            .map(|(a, b)| a * by_ops.0 + b * by_ops.1);
        self.latencies.extend(other.latencies);
        self.latencies.sort();
        Measured {
            ops,
            secs,
            latencies: self.latencies,
            statements: self.statements + other.statements,
            failed: self.failed + other.failed,
            cpu,
            postgres_ms_per_op,
        }
    }

    fn report(&self) -> Value {
        json!({
            "per_sec": self.ops as f64 / self.secs.max(f64::MIN_POSITIVE),
            "p50_ms": percentile(&self.latencies, 0.5),
            "p99_ms": percentile(&self.latencies, 0.99),
            "statements_per_op": self.statements as f64 / self.ops.max(1) as f64,
            "failed": self.failed,
            "cpu": self.cpu,
            "postgres_ms_per_op": self.postgres_ms_per_op,
        })
    }
}

/// `ops` through the handlers of `instances`, one caller per instance.
async fn api_phase(
    counter: (&StatementCounter, &[String]),
    (instances, source): (Arc<Vec<Arc<ApiState>>>, &str),
    ops: Vec<Op>,
    concurrency: usize,
) -> Measured {
    let source = source.to_owned();
    phase(counter, ops, concurrency, move |slot, op| {
        let (state, source) = (instances[slot].clone(), source.clone());
        async move { through_handler(&state, &source, op).await }
    })
    .await
}

/// `ops` as the same library calls on the raw connections, one caller per connection.
async fn raw_phase(
    counter: (&StatementCounter, &[String]),
    (raw, source, period, catalog): (Arc<Vec<Mutex<PgConnection>>>, &str, &Period, &Catalog),
    ops: Vec<Op>,
    concurrency: usize,
) -> Measured {
    let (source, period, catalog) = (source.to_owned(), period.clone(), catalog.clone());
    phase(counter, ops, concurrency, move |slot, op| {
        let (raw, source, period, catalog) =
            (raw.clone(), source.clone(), period.clone(), catalog.clone());
        async move {
            let mut conn = raw[slot].lock().await;
            raw_call(&mut conn, &source, &period, &catalog, op)
                .await
                .is_ok()
        }
    })
    .await
}

/// Runs `work` over `ops` with `concurrency` callers: the latencies, SQL statements, the
/// operations that failed, and the cores' shares.
async fn phase<F, Fut>(
    (counter, backends): (&StatementCounter, &[String]),
    ops: Vec<Op>,
    concurrency: usize,
    work: F,
) -> Measured
where
    F: Fn(usize, Op) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let count = ops.len();
    let failed = Arc::new(AtomicU64::new(0));
    let work = Arc::new(work);
    let statements = counter.get();
    let postgres = backend_ticks(backends);
    let start = Instant::now();
    let cpu = CpuMeter::start();
    let latencies = {
        let failed = failed.clone();
        run_concurrently(ops, concurrency, move |slot, op| {
            let (work, failed) = (work.clone(), failed.clone());
            async move {
                if !work(slot, op).await {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await
    };
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu.since(count);
    let postgres_ms_per_op = postgres
        .zip(backend_ticks(backends))
        .map(|(before, after)| {
            (after - before) as f64 * CpuMeter::MS_PER_TICK / count.max(1) as f64
        });
    Measured {
        ops: count,
        secs,
        latencies,
        statements: counter.get() - statements,
        failed: failed.load(Ordering::Relaxed),
        cpu,
        postgres_ms_per_op,
    }
}

/// The CPU ticks so far of the Postgres backends serving a phase's connections (their pids);
/// `None` where one cannot be read (another machine, another user's /proc hidden).
fn backend_ticks(pids: &[String]) -> Option<u64> {
    pids.iter()
        .map(|pid| crate::bench::process_ticks(pid))
        .sum()
}

/// The pid of the backend serving a connection.
async fn backend_pid(conn: &mut PgConnection) -> anyhow::Result<String> {
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await?;
    Ok(pid.to_string())
}

/// Round trips per read, feature check, debit and hot debit counted on the wire: through the
/// handler of one api instance and on one raw connection, each through a counting proxy, after
/// a warm-up.
async fn wire_round_trips(
    server: &str,
    direct: PgConnectOptions,
    instance: impl Fn(PgConnectOptions) -> ApiState,
    (source, period, catalog): (&str, &Period, &Catalog),
    (spread, hot): (&[CustomerId], &CustomerId),
) -> anyhow::Result<Value> {
    let wire = WireCounter::start(crate::bench::tcp_upstream(server, "--api")?).await?;
    let options = direct
        .host(&wire.addr.ip().to_string())
        .port(wire.addr.port())
        .ssl_mode(PgSslMode::Disable);
    let state = instance(options.clone());
    let mut raw = options.connect().await?;
    let ops = |kind: &str, side: &str| -> Vec<Op> {
        (0..WIRE_OPS)
            .map(|n| match kind {
                "read" => Op::Read(spread[n % spread.len()].clone()),
                "feature" => Op::Feature(spread[n % spread.len()].clone(), BENCH_FEATURE),
                "credits" => Op::Credits(spread[n % spread.len()].clone()),
                "debit" => Op::Debit(spread[n % spread.len()].clone(), format!("wire-{side}-{n}")),
                _ => Op::Debit(hot.clone(), format!("wire-{side}-hot-{n}")),
            })
            .collect()
    };
    for op in [
        Op::Read(hot.clone()),
        Op::Credits(hot.clone()),
        Op::Debit(hot.clone(), "wire-warm".into()),
    ] {
        anyhow::ensure!(
            through_handler(&state, source, op).await,
            "a warm-up request through the counting proxy failed"
        );
    }
    for op in [
        Op::Read(hot.clone()),
        Op::Credits(hot.clone()),
        Op::Debit(hot.clone(), "wire-warm-raw".into()),
    ] {
        raw_call(&mut raw, source, period, catalog, op).await?;
    }
    let mut api_trips = Map::new();
    let mut raw_trips = Map::new();
    for kind in PHASES {
        wire.take();
        for op in ops(kind, "api") {
            anyhow::ensure!(
                through_handler(&state, source, op).await,
                "a request through the counting proxy failed"
            );
        }
        api_trips.insert(kind.into(), json!(wire.take() as f64 / WIRE_OPS as f64));
        for op in ops(kind, "raw") {
            raw_call(&mut raw, source, period, catalog, op).await?;
        }
        raw_trips.insert(kind.into(), json!(wire.take() as f64 / WIRE_OPS as f64));
    }
    // A debit that spans grants: the first spread account's allowance spent, then packs
    // enough for every counted debit and its warm-up.
    let spender = &spread[0];
    spend_the_allowance_and_buy_packs(&mut raw, (source, spender), period, catalog).await?;
    for op in [
        Op::SpanningDebit(spender.clone(), "wire-span-warm".into()),
        Op::SpanningDebit(spender.clone(), "wire-span-warm-raw".into()),
    ] {
        raw_call(&mut raw, source, period, catalog, op).await?;
    }
    wire.take();
    for n in 0..WIRE_OPS {
        let op = Op::SpanningDebit(spender.clone(), format!("wire-span-api-{n}"));
        anyhow::ensure!(
            through_handler(&state, source, op).await,
            "a debit spanning grants through the counting proxy failed"
        );
    }
    api_trips.insert(
        "spanning_debit".into(),
        json!(wire.take() as f64 / WIRE_OPS as f64),
    );
    for n in 0..WIRE_OPS {
        let op = Op::SpanningDebit(spender.clone(), format!("wire-span-raw-{n}"));
        raw_call(&mut raw, source, period, catalog, op).await?;
    }
    raw_trips.insert(
        "spanning_debit".into(),
        json!(wire.take() as f64 / WIRE_OPS as f64),
    );
    Ok(json!({"ops": WIRE_OPS, "api": api_trips, "raw": raw_trips}))
}

/// Spends what the account's allowance has left in one debit, then gives it the packs the
/// spanning debits take from: the `credit_grants` rows the worker writes for a catalog pack's
/// paid payment (`credits::pack_grant`), held by the account's latest event. Not counted.
async fn spend_the_allowance_and_buy_packs(
    conn: &mut PgConnection,
    (source, customer): (&str, &CustomerId),
    period: &Period,
    catalog: &Catalog,
) -> anyhow::Result<()> {
    let left = account::snapshot(conn, source, customer, period, catalog)
        .await?
        .context("a seeded account is missing")?
        .remaining;
    if left > 0 {
        let ask = DebitRequest {
            source,
            customer,
            key: "wire-span-allowance",
            amount: left,
            period: DebitPeriod::Arrival(period.clone()),
            note: None,
            effects: None,
            meter: None,
            unit: shared::billing::credits::ALLOWANCE_UNIT,
        };
        let spent = usage::debit(conn, &ask).await?;
        anyhow::ensure!(
            matches!(spent.debit, Debit::Accepted { remaining: 0, .. }),
            "the allowance was not spent: {:?}",
            spent.debit
        );
    }
    let packs = (WIRE_OPS as i64 + 1) * 2 * SPANNING_DEBIT / SPANNING_PACK + 1;
    sqlx::query(
        "INSERT INTO credit_grants (source, customer_id, grant_id, origin, unit, scope, amount,
                                    category, created_at, effective_at, version_at, version_key,
                                    event_id)
         SELECT $1, $2, 'pack:bench_' || n || ':price_bench_pack', 'catalog_pack', 'credits',
                'all', $3, 'paid', now() - interval '1 day', now() - interval '1 day',
                now() - interval '1 day', 'bench_pack_' || n,
                (SELECT max(id) FROM inbox_events)
         FROM generate_series(1, $4::bigint) n",
    )
    .bind(source)
    .bind(customer.as_str())
    .bind(SPANNING_PACK)
    .bind(packs)
    .execute(&mut *conn)
    .await
    .context("giving the spanning debits' account its packs")?;
    Ok(())
}

/// A loopback proxy in front of Postgres that counts the client's messages ending a round
/// trip: `Sync` (the extended protocol's end of a statement) and `Query` (a simple query), as
/// tests/api/round_trips.rs counts them. Its connections end with their clients'.
struct WireCounter {
    addr: SocketAddr,
    trips: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl WireCounter {
    async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let trips = Arc::new(AtomicU64::new(0));
        let counted = trips.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let trips = counted.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut client_read, mut client_write) = client.into_split();
                    let (mut server_read, mut server_write) = server.into_split();
                    let replies = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                    });
                    let _ = count_messages(&mut client_read, &mut server_write, &trips).await;
                    let _ = server_write.shutdown().await;
                    let _ = replies.await;
                });
            }
        });
        Ok(Self {
            addr,
            trips,
            accept,
        })
    }

    /// The round trips since the last take.
    fn take(&self) -> u64 {
        self.trips.swap(0, Ordering::SeqCst)
    }
}

impl Drop for WireCounter {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies the client's messages to the server, counting each `Sync` and `Query`. The startup
/// messages have no type byte (an SSL request first, refused by the server or not sent).
async fn count_messages(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    trips: &AtomicU64,
) -> std::io::Result<()> {
    const SSL_REQUEST: [u8; 4] = 80_877_103u32.to_be_bytes();
    loop {
        let len = from.read_u32().await?;
        let mut rest = vec![0; (len as usize).saturating_sub(4)];
        from.read_exact(&mut rest).await?;
        to.write_u32(len).await?;
        to.write_all(&rest).await?;
        if !(len == 8 && rest[..4] == SSL_REQUEST) {
            break;
        }
    }
    loop {
        let kind = from.read_u8().await?;
        let len = from.read_u32().await?;
        let mut rest = vec![0; (len as usize).saturating_sub(4)];
        from.read_exact(&mut rest).await?;
        if kind == b'S' || kind == b'Q' {
            trips.fetch_add(1, Ordering::SeqCst);
        }
        to.write_u8(kind).await?;
        to.write_u32(len).await?;
        to.write_all(&rest).await?;
    }
}

/// The report as a table: one row per level and phase.
fn text(report: &Value) -> String {
    let f = |v: &Value, digits: usize| {
        v.as_f64()
            .map(|x| format!("{x:.digits$}"))
            .unwrap_or_else(|| "-".into())
    };
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY)
        .set_header(vec![
            "phase",
            "api /s",
            "raw /s",
            "ratio",
            "api p50 / p99 ms",
            "raw p50 / p99 ms",
            "statements per op (api / raw)",
            "round trips per op (api / raw)",
            "cores busy (api / raw)",
            "CPU ms per op, api: this process + the others",
            "failed",
        ]);
    let names = [
        ("read", "reads"),
        ("feature", "feature checks"),
        ("credits", "credits reads"),
        ("debit", "debits"),
        ("hot_debit", "debits, one hot account"),
    ];
    let trips = &report["round_trips"];
    for level in report["levels"].as_array().into_iter().flatten() {
        for (key, name) in names {
            let (phase, api, raw) = (&level[key], &level[key]["api"], &level[key]["raw"]);
            let busy = |v: &Value| {
                v["cpu"]["busy"]
                    .as_f64()
                    .map_or("-".into(), |b| format!("{:.0}%", b * 100.0))
            };
            t.add_row(vec![
                format!("c{} {name}", level["concurrency"]),
                f(&api["per_sec"], 0),
                f(&raw["per_sec"], 0),
                format!("{}×", f(&phase["ratio"], 2)),
                format!("{} / {}", f(&api["p50_ms"], 2), f(&api["p99_ms"], 2)),
                format!("{} / {}", f(&raw["p50_ms"], 2), f(&raw["p99_ms"], 2)),
                format!(
                    "{} / {}",
                    f(&api["statements_per_op"], 2),
                    f(&raw["statements_per_op"], 2)
                ),
                format!(
                    "{} / {}",
                    f(&trips["api"][key], 2),
                    f(&trips["raw"][key], 2)
                ),
                format!("{} / {}", busy(api), busy(raw)),
                format!(
                    "{} + {}",
                    f(&api["cpu"]["own_ms_per_op"], 3),
                    f(&api["cpu"]["others_ms_per_op"], 3)
                ),
                format!(
                    "{}",
                    api["failed"].as_u64().unwrap_or(0) + raw["failed"].as_u64().unwrap_or(0)
                ),
            ]);
        }
    }
    format!(
        "{} operations per phase; reads, feature checks, credits reads and debits over {} customers of '{}', the hot account {}; \
         each account's credits: {BENCH_GRANTS} grants of {BENCH_TRANSACTIONS} transactions and {} debits that reached them; \
         {} cores; Postgres round trip {} ms (median of 200 SELECT 1{})\n{t}\n\
         Round trips counted on the wire over {} operations of each kind, after a warm-up; \
         a debit spanning grants (allowance spent, {SPANNING_DEBIT} from packs of {SPANNING_PACK}): {} / {}.",
        report["requests"],
        report["customers"],
        report["source"].as_str().unwrap_or_default(),
        report["hot_customer"].as_str().unwrap_or_default(),
        report["credit_debits"],
        report["cores"],
        f(&report["pg_round_trip_ms"], 3),
        match report["pg_delay_ms"].as_f64() {
            Some(d) if d > 0.0 => format!(", through a proxy adding {d} ms"),
            _ => String::new(),
        },
        trips["ops"],
        f(&trips["api"]["spanning_debit"], 2),
        f(&trips["raw"]["spanning_debit"], 2),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(ops: usize, secs: f64, busy: f64) -> Measured {
        Measured {
            ops,
            secs,
            latencies: vec![Duration::from_millis(1); ops],
            statements: ops as u64,
            failed: 0,
            cpu: json!({"busy": busy, "ms_per_op": 0.1, "own_ms_per_op": 0.02,
                        "others_ms_per_op": 0.08}),
            postgres_ms_per_op: Some(0.05),
        }
    }

    #[test]
    fn two_runs_with_every_core_busy_make_a_phase_with_every_core_busy_not_more() {
        // Times whose shares of their sum add up to a hair above 1 in floating point.
        let both = run_of(10, 2.8869813642906457, 1.0).and(run_of(10, 1.715138905033089, 1.0));
        assert_eq!(both.cpu["busy"].as_f64(), Some(1.0));
        let report = both.report();
        assert_eq!(report["statements_per_op"].as_f64(), Some(1.0));
        assert_eq!(report["postgres_ms_per_op"].as_f64(), Some(0.05));
    }
}
