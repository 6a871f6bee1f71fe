//! `inboxctl bench`: the pipeline's library code against the local services, measured as
//! ratios in one run (docs/design.md §8). Everything runs in this process on loopback, in databases
//! and a queue of its own that are removed afterwards; every loop is bounded. With
//! `--pg-delay-ms` the measured phases reach Postgres through a proxy that adds that much to
//! each round trip (`crate::delay`). Its arguments and tools (the databases, the proxy, the
//! meters) serve `inboxctl bench --api` too (`crate::bench_api`, which uses them; `main`
//! chooses between them), and `--meters`, `--budget` and `--peer` likewise.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use clap::Args;
use serde_json::{json, Value};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor, PgPool};

use shared::domain::Catalog;
use shared::handlers::intake::IntakeState;
use shared::handlers::worker::{WorkerSource, WorkerState};
use shared::platform::config::{parse_plans, parse_sources};
use shared::platform::db::Held;
use shared::platform::queue::Queue;
use shared::providers::fixtures::{self, Spec};
use shared::providers::Sources;

use crate::delay::DelayProxy;

#[derive(Args)]
pub struct BenchArgs {
    /// Deliveries in the backlog (30% of them copies).
    #[arg(long, default_value_t = 10_000)]
    pub deliveries: usize,
    /// Concurrent intake requests, and concurrent worker invocations (fed by twice as many
    /// pollers).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Customers per source the events are spread over (1: every source's events on one hot
    /// account, which the worker applies one at a time).
    #[arg(long, default_value_t = 500)]
    pub customers: usize,
    /// Milliseconds added to each Postgres round trip of the measured phases, half each way,
    /// through a loopback proxy (0: none). Loopback's round trip is tens of microseconds; RDS's
    /// in one availability zone is about 0.3–0.5 ms.
    #[arg(long, default_value_t = 0.0)]
    pub pg_delay_ms: f64,
    /// Measure the app API instead (`crate::bench_api`): reads, feature checks and debits
    /// through the api function's handler against the same library calls run raw, at
    /// concurrency 4 and 16.
    #[arg(long)]
    pub api: bool,
    /// With --api: operations in each measured phase.
    #[arg(long, default_value_t = 5_000, requires = "api")]
    pub requests: usize,
    /// With --api: accepted debits per seeded account that reached its credit grants, for the
    /// credits read's cost as they grow (docs/design.md §4.14).
    #[arg(long, default_value_t = 0, requires = "api")]
    pub credit_debits: usize,
    /// Measure meter reports instead (`crate::bench_meters`): this many debits with reports
    /// written, then sent by `meters::send` from concurrent tasks to a fake Stripe meter on
    /// loopback that counts identifiers and duplicates.
    #[arg(long, conflicts_with = "api")]
    pub meters: Option<usize>,
    /// With --meters: the concurrent senders.
    #[arg(long, default_value_t = 32, requires = "meters")]
    pub senders: usize,
    /// Measure one source's budget of provider API calls instead (`crate::bench_budget`): this
    /// many thin events in a burst, each read back, while the scheduler's reconciliation walks
    /// as many events and debits are reported, against the fake Stripe's documented limits.
    #[arg(long, conflicts_with_all = ["api", "meters"])]
    pub budget: Option<usize>,
    /// With --budget: the debits with meter reports written meanwhile, at a steady pace.
    #[arg(long, default_value_t = 300, requires = "budget")]
    pub debits: usize,
    /// With --budget: the Stripe source and the fake in live mode (100 operations a second,
    /// the meter events apart), not the sandbox's 25.
    #[arg(long, requires = "budget")]
    pub live: bool,
    /// Measure billing-inbox beside the Stripe sync engine instead (`crate::bench_peer`): the
    /// same signed subscription deliveries through each, in process and over HTTP on
    /// loopback, at concurrency 4 and 16.
    #[arg(long, conflicts_with_all = ["api", "meters", "budget"], requires = "peer_dir")]
    pub peer: bool,
    /// With --peer: the folder where scripts/peer-bench installed the engine (its
    /// node_modules and drive.js).
    #[arg(long)]
    pub peer_dir: Option<std::path::PathBuf>,
    /// With --peer: the local SQS server's process id, for its share of the CPU.
    #[arg(long)]
    pub peer_sqs_pid: Option<u32>,
    /// With --peer: measure instead the stack `scripts/dev` runs, its intake at this base URL
    /// (as INTAKE_URL), with --database-url its database: 16 concurrent senders.
    #[arg(long, requires = "peer")]
    pub peer_dev_intake: Option<String>,
    #[arg(long, env = "INBOX_PLANS", hide_env_values = true)]
    pub plans: String,
    #[command(flatten)]
    pub signing: crate::send::SigningArgs,
}

/// Counts the SQL statements sqlx runs (it logs each one under the `sqlx::query` target).
#[derive(Clone, Default)]
pub struct StatementCounter(Arc<AtomicU64>);

impl StatementCounter {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StatementCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() == "sqlx::query" {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub(crate) struct Delivery {
    pub(crate) source: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

/// The machine's CPU time so far (every process: Postgres, the SQS server, this one), in the
/// clock ticks of /proc/stat's first line: busy (user, nice, system, irq, softirq) and all
/// (busy, idle, iowait, steal). `None` where there is no /proc/stat.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = ticks[..] else {
        return None;
    };
    let busy = user + nice + system + irq + softirq;
    Some((busy, busy + idle + iowait + steal))
}

/// This process's CPU time so far, every thread (user and system), in the same ticks: the
/// caller's share of a phase (the handlers, sqlx, the SQS client and the load itself).
fn own_ticks() -> Option<u64> {
    process_ticks("self")
}

/// A process's CPU time so far (user and system, every thread) in the same ticks, by its
/// /proc name (a pid, or `self`); `None` where it cannot be read.
pub(crate) fn process_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis
    // start at field 3, so utime and stime (14 and 15) are the 12th and 13th of them.
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let user: u64 = rest.next()?.parse().ok()?;
    let system: u64 = rest.next()?.parse().ok()?;
    Some(user + system)
}

/// A process's CPU time so far in nanoseconds, every thread's (`/proc/<pid>/task/*/schedstat`,
/// whose first field is the time on a CPU), by its /proc name (a pid, or `self`); finer than
/// the ticks, for phases of a few milliseconds. `None` where it cannot be read.
pub(crate) fn cpu_ns(pid: &str) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Ticks read at one moment: the machine's busy and all, and this process's own.
pub(crate) type Ticks = Option<((u64, u64), u64)>;

pub(crate) fn ticks() -> Ticks {
    cpu_ticks().zip(own_ticks())
}

/// How much of the machine's cores a phase used, from its start, and how much of that was
/// this process's.
pub(crate) struct CpuMeter(pub(crate) Ticks);

impl CpuMeter {
    /// /proc/stat counts in USER_HZ, 100 a second on Linux whatever the kernel's own tick.
    pub(crate) const MS_PER_TICK: f64 = 10.0;

    pub(crate) fn start() -> Self {
        Self(ticks())
    }

    /// The share of all cores busy since the start; busy CPU milliseconds per operation, and
    /// of them this process's (`own`) and every other's (`others`: Postgres, the SQS server,
    /// the kernel's network work). Nulls where /proc is missing.
    pub(crate) fn since(&self, operations: usize) -> Value {
        self.until(ticks(), operations)
    }

    /// The same, up to `end` (ticks read earlier).
    pub(crate) fn until(&self, end: Ticks, operations: usize) -> Value {
        let (Some(((busy0, all0), own0)), Some(((busy1, all1), own1))) = (self.0, end) else {
            return json!({"busy": null, "ms_per_op": null, "own_ms_per_op": null,
                          "others_ms_per_op": null});
        };
        let (busy, all) = ((busy1 - busy0) as f64, (all1 - all0).max(1) as f64);
        // Each count is rounded to its own ticks: never let this process exceed the whole.
        let own = ((own1 - own0) as f64).min(busy);
        let per_op = |ticks: f64| ticks * Self::MS_PER_TICK / operations.max(1) as f64;
        json!({
            "busy": busy / all,
            "ms_per_op": per_op(busy),
            "own_ms_per_op": per_op(own),
            "others_ms_per_op": per_op(busy - own),
        })
    }
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

/// The backlog: distinct events over all configured providers, 30% of deliveries copies, shuffled.
/// Event ids are `{prefix}{n}`: a second workload of the same run names other events.
fn workload(
    args: &BenchArgs,
    sender: &crate::send::Sender,
    total: usize,
    prefix: &str,
) -> anyhow::Result<Vec<Delivery>> {
    use rand::seq::SliceRandom;
    use rand::Rng;
    let usable: Vec<_> = sender
        .sources()
        .iter()
        .filter(|s| sender.can_sign(s.kind))
        .collect();
    anyhow::ensure!(
        !usable.is_empty(),
        "INBOX_SOURCES has no source this bench can sign for"
    );
    let distinct = total * 7 / 10;
    let mut deliveries = Vec::with_capacity(total);
    for n in 0..distinct {
        let source = usable[n % usable.len()];
        let kinds = fixtures::kinds(source.kind);
        let plan = fixtures::sample_plan(source.kind);
        let spec = Spec {
            kind: kinds[n % kinds.len()].to_owned(),
            customer: format!("bench_{}", n % args.customers),
            plan: Some(plan.to_owned()),
            at: Utc::now() - chrono::Duration::seconds((n % 3600) as i64),
            object_id: Some(format!("obj_{}", n % 1500)),
            status: None,
            cancel_at_period_end: false,
            event_id: Some(format!("{prefix}{n}")),
            feature: None,
        };
        let (id, payload) = sender.build(&source.name, &spec)?;
        let signed = sender.sign(&source.name, &id, &payload)?;
        deliveries.push(Delivery {
            source: source.name.clone(),
            headers: signed.headers,
            body: signed.body,
        });
    }
    // Copies: the same signed deliveries again, then everything in a shuffled order.
    let mut rng = rand::thread_rng();
    for _ in distinct..total {
        let original = &deliveries[rng.gen_range(0..distinct)];
        let copy = Delivery {
            source: original.source.clone(),
            headers: original.headers.clone(),
            body: original.body.clone(),
        };
        deliveries.push(copy);
    }
    deliveries.shuffle(&mut rng);
    Ok(deliveries)
}

/// A new database `name` on `server`, migrated, and a pool on it; with `via`, the pool
/// connects through the delay proxy listening there (the admin connection does not).
pub(crate) async fn fresh_database(
    server: &str,
    name: &str,
    pool_options: sqlx::postgres::PgPoolOptions,
    via: Option<SocketAddr>,
) -> anyhow::Result<PgPool> {
    let admin = PgPool::connect(server)
        .await
        .context("connecting to DATABASE_URL")?;
    admin
        .execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str())
        .await?;
    admin
        .execute(format!(r#"CREATE DATABASE "{name}""#).as_str())
        .await?;
    let pool = pool_options
        .connect_with(through(server.parse()?, via).database(name))
        .await?;
    shared::MIGRATOR.run(&pool).await?;
    Ok(pool)
}

/// `options` pointed at the delay proxy's address, when there is one; user, database and the
/// rest unchanged.
pub(crate) fn through(options: PgConnectOptions, via: Option<SocketAddr>) -> PgConnectOptions {
    match via {
        Some(addr) => options.host(&addr.ip().to_string()).port(addr.port()),
        None => options,
    }
}

/// With a delay, the proxy in front of `server`: `delay_ms / 2` each way.
pub(crate) fn delay_proxy(server: &str, delay_ms: f64) -> anyhow::Result<Option<DelayProxy>> {
    if delay_ms == 0.0 {
        return Ok(None);
    }
    let upstream = tcp_upstream(server, "--pg-delay-ms")?;
    let one_way = Duration::from_secs_f64(delay_ms / 2000.0);
    let proxy = DelayProxy::start(upstream, one_way).context("starting the delay proxy")?;
    Ok(Some(proxy))
}

/// The address of a TCP `DATABASE_URL`'s server, for a proxy in front of it (`what` names
/// the option that needs one).
pub(crate) fn tcp_upstream(server: &str, what: &str) -> anyhow::Result<SocketAddr> {
    let options: PgConnectOptions = server.parse()?;
    anyhow::ensure!(
        options.get_socket().is_none(),
        "{what} needs a TCP DATABASE_URL, not a Unix socket"
    );
    (options.get_host(), options.get_port())
        .to_socket_addrs()
        .context("resolving DATABASE_URL's host")?
        .next()
        .context("DATABASE_URL's host has no address")
}

/// The median of 200 `SELECT 1` round trips on one connection, after ten to warm it up. A
/// statement without arguments goes as one simple query: one round trip each.
pub(crate) async fn round_trip_ms(options: PgConnectOptions) -> anyhow::Result<f64> {
    let mut conn = options.connect().await?;
    let mut times = Vec::with_capacity(200);
    for n in 0..210 {
        let start = Instant::now();
        conn.execute("SELECT 1").await?;
        if n >= 10 {
            times.push(start.elapsed());
        }
    }
    conn.close().await?;
    times.sort();
    Ok(percentile(&times, 0.5))
}

pub(crate) async fn drop_database(server: &str, name: &str) {
    if let Ok(admin) = PgPool::connect(server).await {
        let _ = admin
            .execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str())
            .await;
    }
}

/// Runs `work` over `items` with `concurrency` tasks; returns each call's latency.
pub(crate) async fn run_concurrently<T, F, Fut>(
    items: Vec<T>,
    concurrency: usize,
    work: F,
) -> Vec<Duration>
where
    T: Send + 'static,
    F: Fn(usize, T) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let queue = Arc::new(std::sync::Mutex::new(items));
    let work = Arc::new(work);
    let mut tasks = Vec::new();
    for slot in 0..concurrency {
        let queue = queue.clone();
        let work = work.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let Some(item) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop() else {
                    return latencies;
                };
                let start = Instant::now();
                work(slot, item).await;
                latencies.push(start.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    all.sort();
    all
}

pub async fn run(
    args: &BenchArgs,
    server: &str,
    counter: &StatementCounter,
    json_output: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (100..=100_000).contains(&args.deliveries),
        "--deliveries must be between 100 and 100000"
    );
    anyhow::ensure!(
        (1..=64).contains(&args.concurrency),
        "--concurrency must be between 1 and 64"
    );
    anyhow::ensure!(
        (1..=100_000).contains(&args.customers),
        "--customers must be between 1 and 100000"
    );
    anyhow::ensure!(
        (0.0..=1000.0).contains(&args.pg_delay_ms),
        "--pg-delay-ms must be between 0 and 1000"
    );
    let catalog = parse_plans(&args.plans)?;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let dbs = [
        format!("inbox_bench_{tag}"),
        format!("inbox_bench_raw_{tag}"),
        format!("inbox_bench_both_{tag}"),
    ];
    let result = bench(args, server, counter, &catalog, &tag, &dbs).await;
    for db in &dbs {
        drop_database(server, db).await;
    }
    let report = result?;
    if json_output {
        crate::output::emit(&report.to_string());
        return Ok(());
    }
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY)
        .set_header(vec!["measure", "pipeline", "raw SQL (ceiling)", "ratio"]);
    let i = &report["intake"];
    let w = &report["worker"];
    let f = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.1}"))
            .unwrap_or_else(|| "-".into())
    };
    let r = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "-".into())
    };
    t.add_row(vec![
        "intake deliveries/s".into(),
        f(&i["per_sec"]),
        f(&i["raw_per_sec"]),
        r(&i["ratio"]),
    ]);
    t.add_row(vec![
        "SQS SendMessage alone /s".into(),
        "".into(),
        f(&i["send_alone_per_sec"]),
        "".into(),
    ]);
    t.add_row(vec![
        "intake vs its ceiling (lower of store and send)".into(),
        f(&i["per_sec"]),
        f(&i["ceiling_per_sec"]),
        r(&i["ratio_to_ceiling"]),
    ]);
    t.add_row(vec![
        "intake vs store and send raw, back to back".into(),
        f(&i["per_sec"]),
        f(&i["store_send_per_sec"]),
        r(&i["ratio_to_store_send"]),
    ]);
    t.add_row(vec![
        "intake vs what the cores allow store and send together".into(),
        f(&i["per_sec"]),
        f(&i["cores_bound_per_sec"]),
        r(&i["ratio_to_cores_bound"]),
    ]);
    t.add_row(vec![
        "intake vs what the services alone allow (a caller that costs nothing)".into(),
        f(&i["per_sec"]),
        f(&i["services_bound_per_sec"]),
        r(&i["ratio_to_services_bound"]),
    ]);
    t.add_row(vec![
        "intake p50 ms".into(),
        f(&i["p50_ms"]),
        f(&i["raw_p50_ms"]),
        "".into(),
    ]);
    t.add_row(vec![
        "intake p99 ms".into(),
        f(&i["p99_ms"]),
        f(&i["raw_p99_ms"]),
        "".into(),
    ]);
    t.add_row(vec![
        "SQL statements per delivery".into(),
        f(&i["statements_per_delivery"]),
        "".into(),
        "".into(),
    ]);
    t.add_row(vec![
        "worker events/s".into(),
        f(&w["per_sec"]),
        f(&w["raw_per_sec"]),
        r(&w["ratio"]),
    ]);
    t.add_row(vec![
        "SQL statements per event".into(),
        f(&w["statements_per_event"]),
        "".into(),
        "".into(),
    ]);
    t.add_row(vec![
        "backlog drain s (to the last batch with work)".into(),
        f(&w["drain_secs"]),
        "".into(),
        "".into(),
    ]);
    let a = &report["audit"];
    t.add_row(vec![
        "audit accounts/s (one connection, as the scheduler)".into(),
        f(&report["audit_accounts_per_sec"]),
        "".into(),
        "".into(),
    ]);
    t.add_row(vec![
        "SQL statements per audited account".into(),
        f(&a["statements_per_account"]),
        "".into(),
        "".into(),
    ]);
    t.add_row(vec![
        "audit again from the checked points, accounts/s".into(),
        f(&report["audit_again_accounts_per_sec"]),
        "".into(),
        "".into(),
    ]);
    t.add_row(vec![
        "SQL statements per account audited from its point".into(),
        f(&report["audit_again"]["statements_per_account"]),
        "".into(),
        "".into(),
    ]);
    let round_trip = if args.pg_delay_ms == 0.0 {
        format!("{} ms, direct", r(&report["pg_round_trip_ms"]))
    } else {
        format!(
            "{} ms through a proxy adding {} ms ({} ms direct)",
            r(&report["pg_round_trip_ms"]),
            args.pg_delay_ms,
            r(&report["pg_round_trip_direct_ms"])
        )
    };
    let cpu = &report["cpu"];
    let phases = [
        ("raw store", "raw_store", "delivery"),
        ("SendMessage alone", "send_alone", "message"),
        ("raw store then send", "store_send", "delivery"),
        ("intake", "intake", "delivery"),
        ("worker drain", "drain", "event"),
        ("raw worker", "raw_worker", "event"),
        ("audit", "audit", "account"),
        ("audit from the points", "audit_again", "account"),
    ];
    let cores = phases
        .iter()
        .map(|(name, key, per)| {
            let p = &cpu[*key];
            format!(
                "  {name}: {} of the cores busy, {} CPU ms per {per} ({} this process, {} the others)",
                p["busy"]
                    .as_f64()
                    .map_or("-".into(), |b| format!("{:.0}%", b * 100.0)),
                r(&p["ms_per_op"]),
                r(&p["own_ms_per_op"]),
                r(&p["others_ms_per_op"])
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    crate::output::emit(&format!(
        "{} deliveries ({} events, 30% copies, shuffled) over {}, concurrency {}\n\
         Postgres round trip (median of 200 SELECT 1): {round_trip}\n{t}\n\
         Audit: {} accounts compared, {} skipped, {} fields differing from the fold\n\
         The machine's {} cores, every process counted:\n{cores}",
        report["deliveries"],
        report["events"],
        report["sources"],
        args.concurrency,
        a["accounts"],
        a["skipped"],
        a["divergent"],
        cpu["cores"]
    ));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn bench(
    args: &BenchArgs,
    server: &str,
    counter: &StatementCounter,
    catalog: &Catalog,
    tag: &str,
    [db, raw_db, both_db]: &[String; 3],
) -> anyhow::Result<Value> {
    let steady_count = args.deliveries / 2;
    eprintln!(
        "bench: preparing {} signed deliveries, and {steady_count} more for the steady phase",
        args.deliveries
    );
    let sender = args.signing.sender("").await?;
    let deliveries = workload(args, &sender, args.deliveries, "bench_")?;
    let steady_deliveries = workload(args, &sender, steady_count, "steady_")?;
    // Every pool of the measured phases goes through the proxy, and so does each connection
    // opened from a pool's options (the held ones of the intake and the raw store).
    let proxy = delay_proxy(server, args.pg_delay_ms)?;
    let via = proxy.as_ref().map(DelayProxy::addr);
    // The pipeline's pool as the functions build theirs; the raw worker's without the ping
    // before each acquire (sqlx still pings on release), closer to pgbench.
    let pool = fresh_database(
        server,
        db,
        shared::platform::database::pool_options(32),
        via,
    )
    .await?;
    let unpinged = || shared::platform::database::pool_options(32).test_before_acquire(false);
    let raw_pool = fresh_database(server, raw_db, unpinged(), via).await?;
    let both_pool = fresh_database(server, both_db, unpinged(), via).await?;
    // The round trip the phases' connections see, and the one beside it without the proxy.
    eprintln!("bench: Postgres round trips");
    let direct: PgConnectOptions = server.parse::<PgConnectOptions>()?.database(db);
    let round_trip_direct = round_trip_ms(direct.clone()).await?;
    let round_trip = match via {
        Some(_) => round_trip_ms(through(direct, via)).await?,
        None => round_trip_direct,
    };
    // The local SQS server slows down as the backlog grows: generous timeouts, so that the
    // bench measures it rather than failing on it.
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&shared::platform::queue::sdk_config().await)
            .timeout_config(
                aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(60))
                    .operation_timeout(Duration::from_secs(120))
                    .build(),
            )
            .build(),
    );
    let queue_url = create_queue(&sqs, &format!("inbox-bench-{tag}")).await?;
    let send_cpu = CpuMeter::start();
    let send_ceiling = send_alone(&sqs, tag, deliveries.len(), args.concurrency).await;
    let send_cpu = send_cpu.since(deliveries.len());
    let both_url = create_queue(&sqs, &format!("inbox-bench-both-{tag}")).await?;
    let both = (
        both_pool,
        Arc::new(Queue::new(sqs.clone(), both_url.clone())),
    );
    let outcome = measure(
        args,
        counter,
        catalog,
        (deliveries, steady_deliveries),
        pool,
        raw_pool,
        both,
        &sqs,
        &queue_url,
    )
    .await;
    let _ = sqs.delete_queue().queue_url(&queue_url).send().await;
    let _ = sqs.delete_queue().queue_url(&both_url).send().await;
    let mut outcome = outcome?;
    let send_per_sec = send_ceiling?;
    // The intake's ceiling is the lower of its store and its send; only a new event is sent
    // (a copy of a pending one is not), so the send allows that many more deliveries.
    let store_per_sec = outcome["intake"]["raw_per_sec"].as_f64().unwrap_or(0.0);
    let sends_per_delivery =
        outcome["events"].as_f64().unwrap_or(1.0) / outcome["deliveries"].as_f64().unwrap_or(1.0);
    let ceiling = store_per_sec.min(send_per_sec / sends_per_delivery.max(f64::MIN_POSITIVE));
    let intake_per_sec = outcome["intake"]["per_sec"].as_f64().unwrap_or(0.0);
    outcome["intake"]["send_alone_per_sec"] = json!(send_per_sec);
    outcome["intake"]["ceiling_per_sec"] = json!(ceiling);
    outcome["intake"]["ratio_to_ceiling"] = json!(intake_per_sec / ceiling.max(f64::MIN_POSITIVE));
    // What the cores alone allow the store and the send together, from the CPU each used
    // alone: the bound when all of them share the machine, as they do here.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let store_ms = outcome["cpu"]["raw_store"]["ms_per_op"].as_f64();
    let send_ms = send_cpu["ms_per_op"].as_f64();
    // (None too for phases too short for /proc/stat's 10 ms ticks.)
    let cores_bound = store_ms
        .zip(send_ms)
        .map(|(store, send)| store + send * sends_per_delivery)
        .filter(|ms| *ms > 0.0)
        .map(|ms| cores * 1000.0 / ms);
    // What the cores allow a caller that cost nothing at all: only the other processes'
    // CPU (Postgres, the SQS server, the kernel's network work) per delivery when each new
    // event is sent right after its store, as the intake must (the message names the row).
    let services_bound = outcome["cpu"]["store_send"]["others_ms_per_op"]
        .as_f64()
        .filter(|ms| *ms > 0.0)
        .map(|ms| cores * 1000.0 / ms);
    outcome["cpu"]["send_alone"] = send_cpu;
    outcome["cpu"]["cores"] = json!(cores);
    outcome["intake"]["cores_bound_per_sec"] = json!(cores_bound);
    outcome["intake"]["ratio_to_cores_bound"] =
        json!(cores_bound.map(|b| intake_per_sec / b.max(f64::MIN_POSITIVE)));
    outcome["intake"]["services_bound_per_sec"] = json!(services_bound);
    outcome["intake"]["ratio_to_services_bound"] =
        json!(services_bound.map(|b| intake_per_sec / b.max(f64::MIN_POSITIVE)));
    outcome["pg_delay_ms"] = json!(args.pg_delay_ms);
    outcome["pg_round_trip_ms"] = json!(round_trip);
    outcome["pg_round_trip_direct_ms"] = json!(round_trip_direct);
    // The phases' pools are gone: the proxy closes what connections remain and ends its
    // threads.
    drop(proxy);
    Ok(outcome)
}

pub(crate) async fn create_queue(sqs: &aws_sdk_sqs::Client, name: &str) -> anyhow::Result<String> {
    sqs.create_queue()
        .queue_name(name)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(&e)))
        .context("creating a bench queue (is the SQS server up? scripts/dev services)")?
        .queue_url
        .context("CreateQueue returned no URL")
}

/// The SQS server's SendMessage alone, `count` messages at `concurrency`, into a queue of its
/// own (removed afterwards): what the intake's send can reach at most.
async fn send_alone(
    sqs: &aws_sdk_sqs::Client,
    tag: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    eprintln!("bench: SendMessage alone");
    let url = create_queue(sqs, &format!("inbox-bench-send-{tag}")).await?;
    let queue = Arc::new(Queue::new(sqs.clone(), url.clone()));
    let start = Instant::now();
    run_concurrently((0..count as i64).collect(), concurrency, move |_, id| {
        let queue = queue.clone();
        async move {
            let _ = queue.send_event(id).await;
        }
    })
    .await;
    let secs = start.elapsed().as_secs_f64();
    let _ = sqs.delete_queue().queue_url(&url).send().await;
    Ok(count as f64 / secs)
}

/// One delivery through an intake instance's handler, as API Gateway hands it over.
pub(crate) async fn deliver(state: &IntakeState, d: Delivery) {
    let mut builder = http::Request::builder()
        .method("POST")
        .uri(format!("/webhooks/{}", d.source));
    for (k, v) in &d.headers {
        builder = builder.header(k, v);
    }
    if let Ok(request) = builder.body(lambda_http::Body::from(d.body)) {
        let _ = shared::handlers::intake::handle(state, request).await;
    }
}

/// Events applied per second of the drain.
fn worker_rate(applied: i64, secs: f64) -> f64 {
    applied as f64 / secs.max(f64::MIN_POSITIVE)
}

/// How the pollers receive.
#[derive(Clone, Copy)]
pub(crate) enum Polls {
    /// Long polls of a second: for a backlog, where every receive fills its batch at once.
    Long,
    /// A receive that does not wait, and 10 ms between receives that found nothing. The local
    /// SQS server answers a long poll only once it holds a whole batch of 10 or the wait is
    /// over, where SQS answers as soon as it has a message: under a steady load its long polls
    /// would time its batching, not the pipeline. One poller per invocation, so that the empty
    /// receives cost the machine little.
    Short,
}

impl Polls {
    fn pollers(self, concurrency: usize) -> usize {
        match self {
            Self::Long => concurrency * 2,
            Self::Short => concurrency,
        }
    }
}

/// The worker's pollers, as the event source mapping runs them: they receive and delete on
/// their own, and at most `concurrency` invocations of the handler run at once (for a backlog,
/// twice as many pollers as invocations keep the invocations fed while other pollers wait on
/// SQS). Each stops after `idle` empty polls in a row once `stop` is set, or at the deadline;
/// each batch with work stamps `last_work`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_pollers(
    worker: &Arc<WorkerState>,
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    concurrency: usize,
    deadline: Instant,
    polls: Polls,
    (stop, idle): (Arc<AtomicBool>, usize),
    last_work: Arc<std::sync::Mutex<(Instant, Ticks)>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let wait_secs = match polls {
        Polls::Long => 1,
        Polls::Short => 0,
    };
    let invocations = Arc::new(tokio::sync::Semaphore::new(concurrency));
    (0..polls.pollers(concurrency))
        .map(|_| {
            let (worker, sqs, queue_url) = (worker.clone(), sqs.clone(), queue_url.to_owned());
            let (last_work, invocations, stop) =
                (last_work.clone(), invocations.clone(), stop.clone());
            tokio::spawn(async move {
                let mut empty = 0;
                while !(empty >= idle && stop.load(Ordering::SeqCst)) && Instant::now() < deadline {
                    let pumped = shared::dev::lambda_triggers::pump_once(
                        &sqs,
                        &queue_url,
                        wait_secs,
                        |event| {
                            let (worker, invocations) = (worker.clone(), invocations.clone());
                            async move {
                                let _invocation = invocations.acquire().await?;
                                Ok(shared::handlers::worker::handle_batch(&worker, event).await)
                            }
                        },
                    )
                    .await;
                    empty = match pumped {
                        Ok(r) if r.received > 0 => {
                            *last_work.lock().unwrap_or_else(|e| e.into_inner()) =
                                (Instant::now(), ticks());
                            0
                        }
                        Ok(_) => {
                            if let Polls::Short = polls {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                            empty + 1
                        }
                        Err(e) => {
                            eprintln!("bench: {e:#}");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            empty
                        }
                    };
                }
            })
        })
        .collect()
}

/// The pipeline under a steady load: deliveries offered at `offered` a second (open loop:
/// each at its time, whether or not the ones before were answered, on at most `concurrency`
/// intake instances at once) while the worker's pollers apply what arrives. Reports how
/// long an event waited from its store to its final status (the rows' own times, so the
/// SQS hop, the poll and the apply are all in it), and the intake's answers meanwhile.
async fn steady(
    args: &BenchArgs,
    instances: &Arc<Vec<Arc<IntakeState>>>,
    worker: &Arc<WorkerState>,
    (sqs, queue_url): (&aws_sdk_sqs::Client, &str),
    pool: &PgPool,
    deliveries: Vec<Delivery>,
    offered: f64,
) -> anyhow::Result<Value> {
    eprintln!("bench: steady load, {offered:.0} deliveries/s");
    let receive_floor = receive_floor_ms(sqs).await?;
    let count = deliveries.len();
    let since: chrono::DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(pool).await?;
    let start = Instant::now();
    let cpu = CpuMeter::start();
    let deadline = start + Duration::from_secs(900);
    let stop = Arc::new(AtomicBool::new(false));
    let last_work = Arc::new(std::sync::Mutex::new((start, cpu.0)));
    let pollers = spawn_pollers(
        worker,
        sqs,
        queue_url,
        args.concurrency,
        deadline,
        Polls::Short,
        (stop.clone(), 1),
        last_work,
    );
    // Free intake instances: a delivery waits for one only when all are answering.
    let (free, mut next_free) = tokio::sync::mpsc::unbounded_channel();
    for slot in 0..instances.len() {
        let _ = free.send(slot);
    }
    let interval = Duration::from_secs_f64(1.0 / offered.max(1.0));
    let mut answers = Vec::with_capacity(count);
    for (n, d) in deliveries.into_iter().enumerate() {
        let due = start + interval * n as u32;
        tokio::time::sleep_until(due.into()).await;
        let slot = next_free
            .recv()
            .await
            .context("the intake instances are gone")?;
        let (state, free) = (instances[slot].clone(), free.clone());
        answers.push(tokio::spawn(async move {
            deliver(&state, d).await;
            let _ = free.send(slot);
            // From the delivery's time, not from when an instance was free for it.
            due.elapsed()
        }));
    }
    let mut latencies = Vec::with_capacity(count);
    for answer in answers {
        latencies.extend(answer.await.ok());
    }
    latencies.sort();
    let offered_secs = start.elapsed().as_secs_f64();
    // Every event of the phase final, or a minute more: then the pollers stop. An event
    // still waiting then is one whose message was lost (`unfinished`).
    let deadline = deadline.min(Instant::now() + Duration::from_secs(60));
    let (events, unfinished) = loop {
        let (events, waiting): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE status NOT IN ('applied', 'ignored', 'unprocessable', 'dead'))
             FROM inbox_events WHERE received_at >= $1",
        )
        .bind(since)
        .fetch_one(pool)
        .await?;
        if waiting == 0 || Instant::now() >= deadline {
            break (events, waiting);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let cpu = cpu.since(count);
    stop.store(true, Ordering::SeqCst);
    for p in pollers {
        let _ = p.await;
    }
    let (p50, p99, max): (Option<f64>, Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
         FROM (SELECT extract(epoch FROM processed_at - received_at)::float8 * 1000 AS ms
               FROM inbox_events WHERE received_at >= $1 AND processed_at IS NOT NULL) AS waited",
    )
    .bind(since)
    .fetch_one(pool)
    .await?;
    Ok(json!({
        "offered_per_sec": offered,
        "achieved_per_sec": count as f64 / offered_secs,
        "deliveries": count,
        "events": events,
        "unfinished": unfinished,
        "stored_to_final_p50_ms": p50,
        "stored_to_final_p99_ms": p99,
        "stored_to_final_max_ms": max,
        "intake_p50_ms": percentile(&latencies, 0.5),
        "intake_p99_ms": percentile(&latencies, 0.99),
        "sqs_receive_floor_ms": receive_floor,
        "cpu": cpu,
    }))
}

/// What the local SQS server alone adds to an event's wait: one message sent to an empty
/// queue of its own, then received as the steady phase's pollers receive (no wait, up to
/// 10); the median of 20. The server scans its queue every 10 ms and answers a receive with
/// fewer messages than asked for only 40 ms after it came, where SQS answers at once.
async fn receive_floor_ms(sqs: &aws_sdk_sqs::Client) -> anyhow::Result<f64> {
    let name = format!("inbox-bench-floor-{}", uuid::Uuid::new_v4().simple());
    let queue_url = create_queue(sqs, &name).await?;
    let floor = receive_floor_on(sqs, &queue_url).await;
    let _ = sqs.delete_queue().queue_url(&queue_url).send().await;
    floor
}

async fn receive_floor_on(sqs: &aws_sdk_sqs::Client, queue_url: &str) -> anyhow::Result<f64> {
    let mut waits = Vec::new();
    for n in 0..20 {
        sqs.send_message()
            .queue_url(queue_url)
            .message_body(format!("floor-{n}"))
            .send()
            .await
            .context("SendMessage")?;
        let sent = Instant::now();
        let message = loop {
            let received = sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(0)
                .send()
                .await
                .context("ReceiveMessage")?;
            if let Some(message) = received.messages.unwrap_or_default().pop() {
                break message;
            }
            anyhow::ensure!(
                sent.elapsed() < Duration::from_secs(5),
                "a sent message never came"
            );
        };
        waits.push(sent.elapsed());
        if let Some(handle) = message.receipt_handle() {
            let _ = sqs
                .delete_message()
                .queue_url(queue_url)
                .receipt_handle(handle)
                .send()
                .await;
        }
    }
    waits.sort();
    Ok(percentile(&waits, 0.5))
}

/// Bytes of write-ahead log the server has written so far (every database on it: the bench
/// runs one phase at a time).
pub(crate) async fn wal_bytes(pool: &PgPool) -> anyhow::Result<f64> {
    Ok(
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8")
            .fetch_one(pool)
            .await?,
    )
}

/// Each table's bytes on disk, with its indexes and TOAST, in the bench's database; a table
/// stored by month (docs/design.md §3.14) as the sum of its partitions.
async fn stored_bytes(pool: &PgPool) -> anyhow::Result<Vec<(String, f64)>> {
    Ok(sqlx::query_as(
        "SELECT COALESCE(pg_partition_root(c.oid), c.oid)::regclass::text,
                sum(pg_total_relation_size(c.oid))::float8
         FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname <> '_sqlx_migrations'
         GROUP BY 1
         ORDER BY 2 DESC",
    )
    .fetch_all(pool)
    .await?)
}

/// The rows written to the event's tables so far: inserts, updates, and of the updates the
/// HOT ones (a new row version on the same page, no index entry), each table the sum of its
/// partitions. Read after a wait that outlasts the server's 10 s flush of an idle
/// connection's counts, so that the last batches are in them.
async fn row_writes(pool: &PgPool) -> anyhow::Result<Value> {
    tokio::time::sleep(Duration::from_secs(11)).await;
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT COALESCE(pg_partition_root(relid), relid)::regclass::text,
                sum(n_tup_ins)::bigint, sum(n_tup_upd)::bigint, sum(n_tup_hot_upd)::bigint,
                sum(n_tup_del)::bigint
         FROM pg_stat_user_tables
         WHERE relname LIKE 'inbox_%' OR relname LIKE 'deliveries%'
         GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    Ok(Value::Array(
        rows.into_iter()
            .map(|(table, inserted, updated, hot, deleted)| {
                json!({"table": table, "inserted": inserted, "updated": updated, "hot": hot, "deleted": deleted})
            })
            .collect(),
    ))
}

/// A delivery as verification leaves it: source, body, the verified event, the kept headers.
type RawItem = (String, Vec<u8>, shared::domain::VerifiedEvent, Value);

/// The intake's store statement run raw over `items`, one connection per concurrent caller
/// and no pool pings (as pgbench runs a statement); with `send`, each new event is then sent,
/// as the intake does after its store.
async fn raw_store(
    pool: &PgPool,
    items: Vec<RawItem>,
    concurrency: usize,
    send: Option<Arc<Queue>>,
) -> Vec<Duration> {
    let connections: Arc<Vec<Held>> = Arc::new(
        (0..concurrency)
            .map(|_| Held::new(pool.connect_options().as_ref().clone()))
            .collect(),
    );
    run_concurrently(
        items,
        concurrency,
        move |slot, (source, body, verified, headers)| {
            let (connections, send) = (connections.clone(), send.clone());
            async move {
                let stored = shared::inbox::store::store_verified_held(
                    &connections[slot],
                    &source,
                    &body,
                    &verified,
                    shared::inbox::store::Origin::Delivery(&headers),
                )
                .await;
                if let (Some(queue), Ok(stored)) = (send, stored) {
                    if stored.marked {
                        let _ = queue.send_event(stored.event_id).await;
                    }
                }
            }
        },
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &BenchArgs,
    counter: &StatementCounter,
    catalog: &Catalog,
    (deliveries, steady_deliveries): (Vec<Delivery>, Vec<Delivery>),
    pool: PgPool,
    raw_pool: PgPool,
    both: (PgPool, Arc<Queue>),
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
) -> anyhow::Result<Value> {
    let configs = parse_sources(&args.signing.sources).map_err(|e| anyhow::anyhow!("{e}"))?;
    let worker_sources = || {
        configs
            .iter()
            .map(|s| (s.name.clone(), WorkerSource::from(s.kind)))
            .collect()
    };
    let sources = Sources::build(&configs, Duration::from_secs(300), reqwest::Client::new())
        .map_err(|e| anyhow::anyhow!(e))?;
    // One intake instance per concurrent request, as Lambda runs them: each holds its own
    // connection.
    let mut instances = Vec::with_capacity(args.concurrency);
    for _ in 0..args.concurrency {
        let sources = Sources::build(&configs, Duration::from_secs(300), reqwest::Client::new())
            .map_err(|e| anyhow::anyhow!(e))?;
        instances.push(Arc::new(IntakeState::new(
            pool.clone(),
            Queue::new(sqs.clone(), queue_url),
            sources,
        )));
    }
    let instances = Arc::new(instances);
    let total = deliveries.len();
    let distinct = total * 7 / 10;

    // The raw ceiling first: the intake's own statement, with what verification would give.
    let mut raw_items = Vec::with_capacity(total);
    for d in &deliveries {
        let headers: http::HeaderMap = d
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.parse::<http::HeaderName>().ok()?, v.parse().ok()?)))
            .collect();
        let verified = sources
            .get(&d.source)
            .context("a delivery names an unconfigured source")?
            .verify(&headers, &d.body, Utc::now())
            .await
            .map_err(|e| anyhow::anyhow!("a bench delivery does not verify: {e}"))?;
        // The headers the intake keeps from this delivery: the same values in both.
        let kept = shared::handlers::intake::kept_headers(&headers);
        raw_items.push((d.source.clone(), d.body.clone(), verified, kept));
    }
    eprintln!("bench: raw SQL ceiling");
    let raw_start = Instant::now();
    let cpu = CpuMeter::start();
    let raw_latencies = raw_store(&raw_pool, raw_items.clone(), args.concurrency, None).await;
    let raw_secs = raw_start.elapsed().as_secs_f64();
    let raw_store_cpu = cpu.since(total);
    // The store and the send back to back, raw, on a database and a queue of their own: what
    // the two cost together when they share the machine's cores, as they do here.
    eprintln!("bench: raw store and send");
    let both_start = Instant::now();
    let cpu = CpuMeter::start();
    raw_store(&both.0, raw_items, args.concurrency, Some(both.1)).await;
    let both_secs = both_start.elapsed().as_secs_f64();
    let store_send_cpu = cpu.since(total);
    both.0.close().await;

    eprintln!("bench: intake");
    let statements_before = counter.get();
    let wal_before = wal_bytes(&pool).await?;
    let intake_start = Instant::now();
    let cpu = CpuMeter::start();
    let latencies = {
        let instances = instances.clone();
        run_concurrently(deliveries, args.concurrency, move |slot, d| {
            let state = instances[slot].clone();
            async move { deliver(&state, d).await }
        })
        .await
    };
    let intake_secs = intake_start.elapsed().as_secs_f64();
    let intake_cpu = cpu.since(total);
    let intake_statements = counter.get() - statements_before;
    let intake_wal = wal_bytes(&pool).await? - wal_before;

    eprintln!("bench: worker drains the backlog");
    let worker = Arc::new(WorkerState::new(
        pool.clone(),
        worker_sources(),
        catalog.clone(),
    ));
    let statements_before = counter.get();
    let wal_before = wal_bytes(&pool).await?;
    let drain_start = Instant::now();
    let cpu = CpuMeter::start();
    let deadline = drain_start + Duration::from_secs(900);
    // The drain ends with the last batch that brought work, not with the empty polls after;
    // so does its CPU time.
    let last_work = Arc::new(std::sync::Mutex::new((drain_start, cpu.0)));
    let pollers = spawn_pollers(
        &worker,
        sqs,
        queue_url,
        args.concurrency,
        deadline,
        Polls::Long,
        (Arc::new(AtomicBool::new(true)), 3),
        last_work.clone(),
    );
    for p in pollers {
        let _ = p.await;
    }
    let (last_batch, last_ticks) = *last_work.lock().unwrap_or_else(|e| e.into_inner());
    let drain_secs = last_batch.duration_since(drain_start).as_secs_f64();
    let worker_statements = counter.get() - statements_before;
    let drain_cpu = cpu.until(last_ticks, distinct);
    let worker_wal = wal_bytes(&pool).await? - wal_before;
    let stored = stored_bytes(&pool).await?;
    let writes = row_writes(&pool).await?;
    let applied: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM inbox_events WHERE status IN ('applied', 'ignored', 'unprocessable')",
    )
    .fetch_one(&pool)
    .await?;

    // Half of what the machine allows the intake and the worker together (both run on its
    // cores at once now), in deliveries a second: a load the pipeline keeps up with, so that
    // what is measured is the time an event waits, not a queue that grows.
    let events_per_delivery = distinct as f64 / total as f64;
    let together = 1.0
        / (intake_secs / total as f64
            + events_per_delivery / worker_rate(applied, drain_secs).max(f64::MIN_POSITIVE));
    let offered = together / 2.0;
    let mut steady = steady(
        args,
        &instances,
        &worker,
        (sqs, queue_url),
        &pool,
        steady_deliveries,
        offered,
    )
    .await?;

    eprintln!("bench: raw worker transactions");
    let raw_worker = Arc::new(WorkerState::new(
        raw_pool.clone(),
        worker_sources(),
        catalog.clone(),
    ));
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM inbox_events ORDER BY id")
        .fetch_all(&raw_pool)
        .await?;
    // The same batches of 10 the event source mapping hands over, through the same handler,
    // with no queue in between.
    let batches: Vec<_> = ids
        .chunks(10)
        .map(|chunk| {
            let messages: Vec<aws_sdk_sqs::types::Message> = chunk
                .iter()
                .map(|id| {
                    aws_sdk_sqs::types::Message::builder()
                        .message_id(format!("raw-{id}"))
                        .body(shared::platform::queue::message_body(*id))
                        .build()
                })
                .collect();
            shared::dev::lambda_triggers::sqs_event(&messages, "raw")
        })
        .collect();
    let raw_worker_start = Instant::now();
    let cpu = CpuMeter::start();
    run_concurrently(batches, args.concurrency, move |_, batch| {
        let raw_worker = raw_worker.clone();
        async move {
            shared::handlers::worker::handle_batch(&raw_worker, batch).await;
        }
    })
    .await;
    let raw_worker_secs = raw_worker_start.elapsed().as_secs_f64();
    let raw_worker_cpu = cpu.since(distinct);

    // The scheduler's audit over every account the bench made, one after another on one
    // connection as the scheduler takes them: its cost per account against the workload's
    // own histories (30% copies, shuffled), and whether any register differs from its fold.
    eprintln!("bench: audit of every account");
    let audit_sources = shared::audit::sources_of(&configs);
    // One connection, as the scheduler's run holds one: its backend's CPU and this process's
    // are the audit's own, whatever else the machine runs meanwhile.
    let audit_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let audit_backend = {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&audit_pool)
            .await?;
        pid.to_string()
    };
    let audit_pass = || async {
        let statements_before = counter.get();
        let start = Instant::now();
        let cpu = CpuMeter::start();
        let own = (cpu_ns("self"), cpu_ns(&audit_backend));
        let report =
            shared::audit::audit_all(&audit_pool, &audit_sources, catalog, None, None).await?;
        let secs = start.elapsed().as_secs_f64();
        let accounts = (report.checked + report.skipped) as usize;
        let per_account = |before: Option<u64>, after: Option<u64>| {
            before
                .zip(after)
                .map(|(b, a)| (a - b) as f64 / 1e6 / accounts.max(1) as f64)
        };
        let own = json!({
            "process_ms_per_account": per_account(own.0, cpu_ns("self")),
            "postgres_ms_per_account": per_account(own.1, cpu_ns(&audit_backend)),
        });
        let statements = counter.get() - statements_before;
        let figures = json!({
            "accounts": report.checked, "skipped": report.skipped,
            "divergent": report.divergent.len(), "secs": secs,
            "accounts_per_sec": report.checked as f64 / secs.max(f64::MIN_POSITIVE),
            "statements_per_account": statements as f64 / accounts.max(1) as f64,
            "own_cpu": own,
        });
        anyhow::Ok((report, figures, cpu.since(accounts)))
    };
    let (audit, audit_figures, audit_cpu) = audit_pass().await?;
    if !audit.divergent.is_empty() {
        eprintln!(
            "bench: the audit found {} fields differing from the fold, e.g. {:?}",
            audit.divergent.len(),
            &audit.divergent[..audit.divergent.len().min(3)]
        );
    }
    // Again, as the scheduler's next run finds the accounts: each from the checked point the
    // first audit kept (docs/design.md §4.11), with no event since it.
    eprintln!("bench: audit of every account again, from its checked point");
    let (_, again_figures, again_cpu) = audit_pass().await?;
    audit_pool.close().await;

    let per_sec = total as f64 / intake_secs;
    let raw_per_sec = total as f64 / raw_secs;
    let store_send_per_sec = total as f64 / both_secs;
    let worker_per_sec = worker_rate(applied, drain_secs);
    let raw_worker_per_sec = distinct as f64 / raw_worker_secs;
    Ok(json!({
        "deliveries": total,
        "events": distinct,
        "customers_per_source": args.customers,
        "stored": {
            "bytes_per_event": stored.iter().map(|(_, b)| b).sum::<f64>() / distinct as f64,
            "tables": stored.iter().map(|(t, b)| (t.clone(), json!(b / distinct as f64))).collect::<serde_json::Map<_, _>>(),
        },
        "sources": configs.iter().map(|s| s.name.clone()).collect::<Vec<_>>().join(", "),
        // Per phase: the share of all cores busy, and busy CPU ms per delivery (intake
        // phases) or per event (worker phases), every process on the machine counted.
        "cpu": {
            "raw_store": raw_store_cpu, "store_send": store_send_cpu, "intake": intake_cpu,
            "drain": drain_cpu, "raw_worker": raw_worker_cpu, "audit": audit_cpu,
            "audit_again": again_cpu,
            "steady": steady.as_object_mut().and_then(|o| o.remove("cpu")),
        },
        "steady": steady,
        "intake": {
            "per_sec": per_sec, "p50_ms": percentile(&latencies, 0.5), "p99_ms": percentile(&latencies, 0.99),
            "raw_per_sec": raw_per_sec, "raw_p50_ms": percentile(&raw_latencies, 0.5),
            "raw_p99_ms": percentile(&raw_latencies, 0.99), "ratio": per_sec / raw_per_sec,
            "store_send_per_sec": store_send_per_sec, "ratio_to_store_send": per_sec / store_send_per_sec,
            "statements_per_delivery": intake_statements as f64 / total as f64,
            "wal_bytes_per_delivery": intake_wal / total as f64,
        },
        "audit_accounts_per_sec": audit_figures["accounts_per_sec"],
        "audit": audit_figures,
        "audit_again_accounts_per_sec": again_figures["accounts_per_sec"],
        "audit_again": again_figures,
        "worker": {
            "applied": applied, "per_sec": worker_per_sec, "raw_per_sec": raw_worker_per_sec,
            "ratio": worker_per_sec / raw_worker_per_sec, "drain_secs": drain_secs,
            "statements_per_event": worker_statements as f64 / applied.max(1) as f64,
            "wal_bytes_per_event": worker_wal / applied.max(1) as f64,
            "row_writes": writes,
        }
    }))
}
