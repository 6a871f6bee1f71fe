//! `inboxctl bench --peer`: billing-inbox beside the Stripe sync engine
//! (`@supabase/stripe-sync-engine`, pinned by scripts/peer-bench/package-lock.json), on the
//! same Postgres server with the same signed deliveries (docs/design.md §8). Each side runs in
//! process (billing-inbox's intake handler and the worker's pollers here; the engine's
//! `processWebhook` from a node driver) and over HTTP on loopback (the intake's handler behind
//! a plain hyper server here; the engine behind a minimal node http server; one node client
//! sends to both), at each concurrency asked for. Each run reports deliveries accepted per
//! second, the time until every subscription's state is final, CPU per delivery by process,
//! WAL bytes, and how many subscriptions end on their newest event's status.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;

use shared::domain::SourceKind;
use shared::handlers::intake::IntakeState;
use shared::handlers::worker::{WorkerSource, WorkerState};
use shared::platform::config::{parse_plans, parse_sources, SourceConfig};
use shared::platform::queue::Queue;
use shared::providers::fixtures;
use shared::providers::Sources;

use crate::bench::{
    create_queue, deliver, drop_database, fresh_database, process_ticks, spawn_pollers, ticks,
    wal_bytes, BenchArgs, CpuMeter, Delivery, Polls, Ticks,
};
use crate::bench_serve;

/// The corpus's subscription events (stripe-node v16 shapes, the subscription's period at its
/// top level as in 2023-10-16; testdata/providers/README.md), the templates of every delivery.
const CREATED: &str =
    include_str!("../../testdata/providers/stripe/pre-basil/customer.subscription.created.json");
const UPDATED: &str =
    include_str!("../../testdata/providers/stripe/pre-basil/customer.subscription.updated.json");
/// billing-inbox in process with its worker started at the intake's last answer: what the intake
/// alone accepts beside the engine's in-process run (its request does the engine's whole work).
const INTAKE_FIRST: &str = "intake-first";
/// The API version the deliveries name: the one the engine's users most often pin.
const API_VERSION: &str = "2023-10-16";
/// Statuses of an event not yet done with (docs/design.md §3): the wait for every state final
/// counts them by `inbox_events_status_received`, a few index pages a poll; counting the rest
/// (`NOT IN` the final ones) read the whole table each 10 ms, Postgres work the engine's side
/// never pays.
const WAITING: &str = "('received', 'processing', 'failed')";

/// One subscription event, before it is signed.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SubEvent {
    pub(crate) id: String,
    pub(crate) subscription: String,
    pub(crate) created: i64,
    pub(crate) status: &'static str,
    pub(crate) previous: Option<&'static str>,
}

/// The deliveries' bodies (30% copies, shuffled) and each subscription's right final status,
/// with whether its events are a same-second pair.
pub(crate) struct Workload {
    pub(crate) bodies: Vec<Vec<u8>>,
    pub(crate) events: usize,
    pub(crate) expected: HashMap<String, (&'static str, bool)>,
}

/// The histories: half of the events on subscriptions whose events are minutes apart
/// (created `incomplete`, `active` a minute later, `past_due` an hour later), half on
/// Stripe's same-second pair (created `incomplete`, then updated `active` in the same
/// second). Event ids are random, as Stripe's are: their order says nothing.
pub(crate) fn histories(events: usize, start: i64, prefix: &str) -> Vec<SubEvent> {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    let id = |rng: &mut rand::rngs::ThreadRng| {
        format!("evt_{:016x}{:08x}", rng.gen::<u64>(), rng.gen::<u32>())
    };
    let mut out = Vec::with_capacity(events + 3);
    let mut n = 0;
    while out.len() < events {
        let at = start + (n as i64 % 3600) * 2;
        if n % 2 == 0 {
            let sub = format!("sub_{prefix}{n:07}a");
            for (offset, status, previous) in [
                (0, "incomplete", None),
                (60, "active", Some("incomplete")),
                (3600, "past_due", Some("active")),
            ] {
                out.push(SubEvent {
                    id: id(&mut rng),
                    subscription: sub.clone(),
                    created: at + offset,
                    status,
                    previous,
                });
            }
        } else {
            let sub = format!("sub_{prefix}{n:07}p");
            for (status, previous) in [("incomplete", None), ("active", Some("incomplete"))] {
                out.push(SubEvent {
                    id: id(&mut rng),
                    subscription: sub.clone(),
                    created: at,
                    status,
                    previous,
                });
            }
        }
        n += 1;
    }
    out
}

/// Each subscription's right final status: its newest event's (by `created`; in a
/// same-second pair, the update's, which names the creation's status as its previous one),
/// and whether its events share a second.
pub(crate) fn expected(events: &[SubEvent]) -> HashMap<String, (&'static str, bool)> {
    let mut by_sub: HashMap<&str, Vec<&SubEvent>> = HashMap::new();
    for e in events {
        by_sub.entry(&e.subscription).or_default().push(e);
    }
    by_sub
        .into_iter()
        .map(|(sub, mut es)| {
            es.sort_by_key(|e| (e.created, e.previous.is_some()));
            let paired = es.windows(2).any(|w| w[0].created == w[1].created);
            let newest = es.last().map_or("", |e| e.status);
            (sub.to_owned(), (newest, paired))
        })
        .collect()
}

/// The event as Stripe sends it: the corpus's event with this one's ids, times and status.
pub(crate) fn payload(e: &SubEvent, plan: &str) -> anyhow::Result<Value> {
    let template = if e.previous.is_some() {
        UPDATED
    } else {
        CREATED
    };
    let mut event: Value = serde_json::from_str(template)?;
    let suffix = e.subscription.trim_start_matches("sub_");
    let customer = format!("cus_{suffix}");
    event["id"] = json!(e.id);
    event["api_version"] = json!(API_VERSION);
    event["created"] = json!(e.created);
    let object = &mut event["data"]["object"];
    let start = e.created - e.created % 3600;
    object["id"] = json!(e.subscription);
    object["customer"] = json!(customer);
    object["status"] = json!(e.status);
    for key in [
        "created",
        "start_date",
        "billing_cycle_anchor",
        "current_period_start",
    ] {
        object[key] = json!(start);
    }
    object["current_period_end"] = json!(start + 30 * 86_400);
    object["latest_invoice"] = Value::Null;
    let items = object["items"]["data"]
        .as_array_mut()
        .context("the corpus's subscription has no items")?;
    for item in items {
        item["id"] = json!(format!("si_{suffix}"));
        item["subscription"] = json!(e.subscription);
        item["price"]["id"] = json!(plan);
        if item["plan"].is_object() {
            item["plan"]["id"] = json!(plan);
        }
    }
    match e.previous {
        Some(previous) => event["data"]["previous_attributes"] = json!({"status": previous}),
        None => {
            if let Some(data) = event["data"].as_object_mut() {
                data.remove("previous_attributes");
            }
        }
    }
    Ok(event)
}

/// When the histories start: four hours before `now` (they span about three), within `now`'s
/// month, so that the events are stored in this month's partition as a deployment's are, not
/// in the kept partition of months with none (docs/design.md §3.14).
fn recent_start(now: chrono::DateTime<chrono::Utc>) -> i64 {
    use chrono::Datelike;
    let month = now
        .date_naive()
        .with_day(1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(now.timestamp(), |d| d.and_utc().timestamp());
    (now.timestamp() - 4 * 3600).max(month)
}

fn workload(total: usize, plan: &str, prefix: &str) -> anyhow::Result<Workload> {
    use rand::seq::SliceRandom;
    use rand::Rng;
    let distinct = total * 7 / 10;
    let events = histories(distinct, recent_start(chrono::Utc::now()), prefix);
    let expected = expected(&events);
    let mut bodies = events
        .iter()
        .map(|e| Ok(serde_json::to_vec(&payload(e, plan)?)?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let distinct = bodies.len();
    let mut rng = rand::thread_rng();
    while bodies.len() < distinct * 10 / 7 {
        let copy = bodies[rng.gen_range(0..distinct)].clone();
        bodies.push(copy);
    }
    bodies.shuffle(&mut rng);
    Ok(Workload {
        bodies,
        events: distinct,
        expected,
    })
}

/// Signed now, as Stripe signs a delivery (each run signs again: the signature's time must be
/// within both sides' tolerance).
fn signed(bodies: &[Vec<u8>], secret: &str) -> Vec<(String, Vec<u8>)> {
    let now = chrono::Utc::now().timestamp();
    bodies
        .iter()
        .map(|b| {
            (
                shared::providers::stripe::fixtures::signature(secret.as_bytes(), now, b),
                b.clone(),
            )
        })
        .collect()
}

/// The deliveries file the node driver reads: `{"body", "signature"}` a line.
fn write_file(path: &Path, deliveries: &[(String, Vec<u8>)]) -> anyhow::Result<()> {
    let mut out = String::new();
    for (signature, body) in deliveries {
        let line = json!({"body": String::from_utf8_lossy(body), "signature": signature});
        out.push_str(&line.to_string());
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// A Postgres server's CPU time so far, in /proc/stat's ticks: its postmaster's own and that
/// of the children it has reaped (the backends that ended), and every live child's (the
/// backends, the WAL writer, the checkpointer). `None` where /proc cannot be read.
pub(crate) fn postgres_ticks(postmaster: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{postmaster}/stat")).ok()?;
    let fields: Vec<u64> = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .skip(11)
        .take(4)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let mut total: u64 = fields.iter().sum();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(postmaster) {
            total += process_ticks(pid).unwrap_or(0);
        }
    }
    Some(total)
}

/// The postmaster of the server `pool` reaches: its backend's parent (the server runs here).
async fn postmaster_of(pool: &PgPool) -> Option<u32> {
    let backend: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{backend}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Where a named share of the CPU is read from.
#[derive(Clone)]
enum Counted {
    Process(String),
    Postgres(u32),
    /// Every live process whose command name (`/proc/<pid>/comm`) is one of these.
    Named(&'static [&'static str]),
}

impl Counted {
    fn ticks(&self) -> Option<u64> {
        match self {
            Self::Process(pid) => process_ticks(pid),
            Self::Postgres(postmaster) => postgres_ticks(*postmaster),
            Self::Named(names) => {
                let mut total = 0;
                for entry in std::fs::read_dir("/proc").ok()?.flatten() {
                    let pid = entry.file_name();
                    let Some(pid) = pid.to_str() else { continue };
                    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"));
                    if comm.is_ok_and(|c| names.contains(&c.trim())) {
                        total += process_ticks(pid).unwrap_or(0);
                    }
                }
                Some(total)
            }
        }
    }
}

/// CPU time of named processes over a run, beside the machine's.
struct Processes {
    machine: CpuMeter,
    named: Vec<(String, Counted, Option<u64>)>,
}

impl Processes {
    fn start(named: &[(&str, Counted)]) -> Self {
        Self {
            machine: CpuMeter::start(),
            named: named
                .iter()
                .map(|(label, what)| (label.to_string(), what.clone(), what.ticks()))
                .collect(),
        }
    }

    /// CPU ms per delivery: the machine's, each named process's, and the rest (whatever else
    /// runs: the kernel's network work, the machine's other tenants). A process that ended
    /// before the reading counts what it `reported` of itself (ms, by label).
    fn since(&self, end: Ticks, deliveries: usize, reported: &[(&str, f64)]) -> Value {
        let machine = self.machine.until(end, deliveries);
        let per = |ticks: u64| ticks as f64 * CpuMeter::MS_PER_TICK / deliveries.max(1) as f64;
        let mut by = serde_json::Map::new();
        let mut named = 0.0;
        for (label, what, start) in &self.named {
            let used = start
                .zip(what.ticks())
                .map(|(a, b)| per(b.saturating_sub(a)))
                .or_else(|| {
                    reported
                        .iter()
                        .find(|(l, _)| l == label)
                        .map(|(_, ms)| ms / deliveries.max(1) as f64)
                });
            named += used.unwrap_or(0.0);
            by.insert(label.clone(), json!(used));
        }
        let total = machine["ms_per_op"].as_f64();
        by.insert(
            "the rest".into(),
            json!(total.map(|t| (t - named).max(0.0))),
        );
        json!({"busy": machine["busy"], "ms_per_delivery": total, "by_process": by})
    }
}

/// What one side's run measured.
struct Measured {
    accepted_secs: f64,
    final_secs: f64,
    accepted: usize,
    cpu: Value,
    wal: f64,
    unfinished: i64,
    first_error: Option<String>,
}

impl Measured {
    fn report(&self, side: &str, mode: &str, c: usize, total: usize, right: Value) -> Value {
        json!({
            "side": side, "mode": mode, "concurrency": c, "deliveries": total,
            "accepted": self.accepted,
            "accepted_per_sec": total as f64 / self.accepted_secs.max(f64::MIN_POSITIVE),
            "accepted_secs": self.accepted_secs,
            "final_secs": self.final_secs,
            "unfinished": self.unfinished,
            "cpu": self.cpu,
            "wal_bytes_per_delivery": self.wal / total.max(1) as f64,
            "first_error": self.first_error,
            "correct": right,
        })
    }
}

/// Whether the server counts statements (`pg_stat_statements` loaded, as the measurement of
/// where the WAL and Postgres's time go asks): the extension is made in the run's database
/// and its counts of that database cleared, so only the run's own statements are read.
async fn statements_counted(pool: &PgPool) -> bool {
    sqlx::raw_sql(
        "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
         SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database
                                             WHERE datname = current_database()), 0);",
    )
    .execute(pool)
    .await
    .is_ok()
}

/// Each statement kind's WAL (full-page images apart) and execution time per delivery, most
/// WAL first, from `pg_stat_statements` of the run's database.
async fn by_statement(pool: &PgPool, deliveries: usize) -> anyhow::Result<Value> {
    let rows: Vec<(String, i64, f64, f64, f64)> = sqlx::query_as(
        "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90), calls,
                wal_bytes::float8, wal_fpi::float8, total_exec_time
         FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query NOT LIKE '%pg_stat_statements%'
         ORDER BY wal_bytes DESC, total_exec_time DESC LIMIT 12",
    )
    .fetch_all(pool)
    .await?;
    let per = deliveries.max(1) as f64;
    Ok(json!(rows
        .into_iter()
        .map(|(query, calls, wal, fpi, ms)| json!({
            "statement": query,
            "calls_per_delivery": calls as f64 / per,
            "wal_bytes_per_delivery": wal / per,
            "full_page_images_per_delivery": fpi / per,
            "exec_ms_per_delivery": ms / per,
        }))
        .collect::<Vec<_>>()))
}

/// Where an event's bytes and row versions went, read after the drain on a connection of its
/// own once the run's connections have closed (their counts flushed): every table's bytes per
/// event with its indexes and TOAST, the event's and the delivery's tables part by part (the
/// heap, the TOAST, each index), and how many of their row updates were HOT (no index
/// written).
async fn storage(server: &str, db: &str, deliveries: usize) -> anyhow::Result<Value> {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let options: sqlx::postgres::PgConnectOptions = server.parse()?;
    let pool = PgPool::connect_with(options.database(db)).await?;
    let storage = storage_of(&pool, deliveries).await;
    pool.close().await;
    storage
}

/// [`storage`] on a pool of the run's database.
async fn storage_of(pool: &PgPool, deliveries: usize) -> anyhow::Result<Value> {
    let pool = pool.clone();
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox_events")
        .fetch_one(&pool)
        .await?;
    let per = events.max(1) as f64;
    let all: f64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0)::float8 FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind = 'r' AND c.relname <> '_sqlx_migrations'",
    )
    .fetch_one(&pool)
    .await?;
    let parts: Vec<(String, String, f64)> = sqlx::query_as(
        // Summed over each table's month partitions (docs/design.md §3.14).
        "WITH parts AS (
             SELECT t.oid, t.reltoastrelid, pg_partition_root(t.oid)::regclass::text AS root
             FROM pg_class t
             WHERE t.relkind = 'r'
               AND pg_partition_root(t.oid) IN ('inbox_events'::regclass, 'deliveries'::regclass)
         )
         SELECT root, 'heap', sum(pg_relation_size(oid))::float8 FROM parts GROUP BY root
         UNION ALL
         SELECT root, 'TOAST', sum(pg_total_relation_size(reltoastrelid))::float8
         FROM parts WHERE reltoastrelid <> 0 GROUP BY root
         UNION ALL
         -- An index of one partition alone has no root: its own name.
         SELECT p.root, COALESCE(pg_partition_root(x.indexrelid), x.indexrelid)::regclass::text,
                sum(pg_relation_size(x.indexrelid))::float8
         FROM pg_index x JOIN parts p ON p.oid = x.indrelid
         GROUP BY 1, 2
         ORDER BY 1 DESC, 3 DESC",
    )
    .fetch_all(&pool)
    .await?;
    let updates: Vec<(String, i64, i64, i64)> = sqlx::query_as(
        "SELECT pg_partition_root(relid)::regclass::text, sum(n_tup_ins)::bigint,
                sum(n_tup_upd)::bigint, sum(n_tup_hot_upd)::bigint
         FROM pg_stat_user_tables
         WHERE pg_partition_root(relid) IN ('inbox_events'::regclass, 'deliveries'::regclass)
         GROUP BY 1 ORDER BY 1 DESC",
    )
    .fetch_all(&pool)
    .await?;
    Ok(json!({
        "events": events,
        "deliveries": deliveries,
        "bytes_per_event": all / per,
        "parts": parts.into_iter().map(|(table, part, bytes)| json!({
            "table": table, "part": part, "bytes_per_event": bytes / per,
        })).collect::<Vec<_>>(),
        "updates": updates.into_iter().map(|(table, inserted, updated, hot)| json!({
            "table": table, "inserted": inserted, "updated": updated, "hot": hot,
        })).collect::<Vec<_>>(),
    }))
}

/// The node driver of one mode, its stdout read line by line.
struct Node {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Node {
    fn spawn(dir: &Path, mode: &str, env: &[(&str, String)]) -> anyhow::Result<Self> {
        let mut command = tokio::process::Command::new("node");
        command
            .arg(dir.join("drive.js"))
            .arg(mode)
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command
            .spawn()
            .context("starting node (scripts/peer-bench)")?;
        let stdout = child.stdout.take().context("node's stdout")?;
        Ok(Self {
            child,
            lines: BufReader::new(stdout).lines(),
        })
    }

    fn pid(&self) -> String {
        self.child.id().map(|p| p.to_string()).unwrap_or_default()
    }

    /// The next line that starts with `prefix` (other lines are the engine's own output).
    async fn line(&mut self, prefix: &str) -> anyhow::Result<String> {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(900), self.lines.next_line())
                .await
                .context("node said nothing for 15 minutes")??
                .with_context(|| format!("node ended before saying '{prefix}'"))?;
            if line.starts_with(prefix) {
                return Ok(line);
            }
        }
    }
}

/// The node driver's JSON result: its clock and counts.
struct NodeResult {
    secs: f64,
    ok: usize,
    /// The node process's own CPU over its clock.
    cpu_ms: f64,
    first_error: Option<String>,
}

fn node_result(line: &str) -> anyhow::Result<NodeResult> {
    let v: Value = serde_json::from_str(line).context("node's result")?;
    Ok(NodeResult {
        secs: v["secs"].as_f64().context("node's result has no secs")?,
        ok: v["ok"].as_u64().unwrap_or(0) as usize,
        cpu_ms: v["cpu_ms"].as_f64().unwrap_or(0.0),
        first_error: v["first_error"].as_str().map(str::to_owned),
    })
}

struct Peer<'a> {
    args: &'a BenchArgs,
    server: &'a str,
    dir: PathBuf,
    file: PathBuf,
    secret: String,
    source: SourceConfig,
    sqs_pid: Option<String>,
    workload: Workload,
    tag: String,
}

pub async fn run(args: &BenchArgs, server: &str, json_output: bool) -> anyhow::Result<()> {
    anyhow::ensure!(
        (100..=100_000).contains(&args.deliveries),
        "--deliveries must be between 100 and 100000"
    );
    let configs = parse_sources(&args.signing.sources).map_err(|e| anyhow::anyhow!("{e}"))?;
    let source = configs
        .iter()
        .find(|s| s.kind == SourceKind::Stripe)
        .context("INBOX_SOURCES has no Stripe source")?
        .clone();
    let secret = source
        .secrets
        .first()
        .context("the Stripe source has no secret")?
        .clone();
    let dir = args
        .peer_dir
        .clone()
        .context("--peer needs --peer-dir (the engine installed by scripts/peer-bench/install)")?;
    let dir = std::fs::canonicalize(&dir).with_context(|| format!("{}", dir.display()))?;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let peer = Peer {
        args,
        server,
        file: std::env::temp_dir().join(format!("inbox-peer-{tag}.jsonl")),
        dir,
        secret,
        workload: workload(
            args.deliveries,
            fixtures::sample_plan(SourceKind::Stripe),
            &format!("p{tag}x"),
        )?,
        source,
        sqs_pid: args.peer_sqs_pid.map(|p| p.to_string()),
        tag,
    };
    if let Some(intake_url) = &args.peer_dev_intake {
        let load_before = load_average();
        let report = peer.dev(intake_url, 16).await;
        let _ = std::fs::remove_file(&peer.file);
        let mut report = report?;
        report["load_average_before"] = load_before;
        report["load_average_after"] = load_average();
        crate::output::emit(&report.to_string());
        return Ok(());
    }
    let load_before = load_average();
    let mut runs = Vec::new();
    for c in [4, 16] {
        for mode in ["in-process", "http"] {
            runs.push(peer.ours(mode, c).await?);
            runs.push(peer.engine(mode, c).await?);
        }
        runs.push(peer.ours(INTAKE_FIRST, c).await?);
    }
    let _ = std::fs::remove_file(&peer.file);
    let paired = peer.workload.expected.values().filter(|(_, p)| *p).count();
    let report = json!({
        "deliveries": args.deliveries,
        "events": peer.workload.events,
        "subscriptions": peer.workload.expected.len(),
        "paired_subscriptions": paired,
        "api_version": API_VERSION,
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "runs": runs,
    });
    if json_output {
        crate::output::emit(&report.to_string());
        return Ok(());
    }
    let mut lines = Vec::new();
    for r in report["runs"].as_array().into_iter().flatten() {
        lines.push(format!(
            "{} {} c{}: {:.0} accepted/s, final after {:.2} s, {:.3} CPU ms per delivery, {:.0} WAL bytes per delivery, right {}/{} (pairs {}/{})",
            r["side"].as_str().unwrap_or("?"),
            r["mode"].as_str().unwrap_or("?"),
            r["concurrency"],
            r["accepted_per_sec"].as_f64().unwrap_or(0.0),
            r["final_secs"].as_f64().unwrap_or(0.0),
            r["cpu"]["ms_per_delivery"].as_f64().unwrap_or(0.0),
            r["wal_bytes_per_delivery"].as_f64().unwrap_or(0.0),
            r["correct"]["distinct_right"],
            r["correct"]["distinct"],
            r["correct"]["paired_right"],
            r["correct"]["paired"],
        ));
    }
    crate::output::emit(&lines.join("\n"));
    Ok(())
}

impl Peer<'_> {
    /// Of each group, the subscriptions whose stored status is their newest event's.
    fn score(&self, stored: &[(String, String)]) -> Value {
        let stored: HashMap<&str, &str> = stored
            .iter()
            .map(|(s, st)| (s.as_str(), st.as_str()))
            .collect();
        let (mut distinct, mut distinct_right, mut paired, mut paired_right) = (0, 0, 0, 0);
        for (sub, (want, is_pair)) in &self.workload.expected {
            let right = stored.get(sub.as_str()) == Some(want);
            if *is_pair {
                paired += 1;
                paired_right += usize::from(right);
            } else {
                distinct += 1;
                distinct_right += usize::from(right);
            }
        }
        json!({"distinct": distinct, "distinct_right": distinct_right,
               "paired": paired, "paired_right": paired_right})
    }

    /// The local stack as `scripts/dev` runs it: the deliveries sent by the node client from
    /// `c` senders to its intake, until every event of them is final in its database.
    async fn dev(&self, intake_url: &str, c: usize) -> anyhow::Result<Value> {
        eprintln!("bench --peer: scripts/dev's stack at {intake_url}, c{c}");
        let pool = PgPool::connect(self.server)
            .await
            .context("connecting to the stack's database")?;
        let deliveries = signed(&self.workload.bodies, &self.secret);
        let total = deliveries.len();
        write_file(&self.file, &deliveries)?;
        let since: chrono::DateTime<chrono::Utc> =
            sqlx::query_scalar("SELECT now()").fetch_one(&pool).await?;
        let url = format!(
            "{}/webhooks/{}",
            intake_url.trim_end_matches('/'),
            self.source.name
        );
        let mut client = Node::spawn(
            &self.dir,
            "send",
            &[
                ("PEER_FILE", self.file.display().to_string()),
                ("PEER_CONCURRENCY", c.to_string()),
                ("PEER_URL", url),
            ],
        )?;
        let mut named = vec![
            ("node client", Counted::Process(client.pid())),
            (
                "the functions (debug builds)",
                Counted::Named(&["intake", "worker", "dispatcher", "scheduler", "api"]),
            ),
            ("cargo lambda watch", Counted::Named(&["cargo-lambda"])),
            ("inboxctl dev (the bridge)", Counted::Named(&["inboxctl"])),
        ];
        if let Some(pid) = &self.sqs_pid {
            named.push(("SQS server", Counted::Process(pid.clone())));
        }
        if let Some(postmaster) = postmaster_of(&pool).await {
            named.push(("Postgres", Counted::Postgres(postmaster)));
        }
        client.line("start").await?;
        let start = Instant::now();
        let meter = Processes::start(&named);
        let result = node_result(&client.line("{").await?)?;
        let deadline = Instant::now() + Duration::from_secs(600);
        let unfinished = loop {
            let waiting: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM inbox_events WHERE received_at >= $1 AND status IN {WAITING}"
            ))
            .bind(since)
            .fetch_one(&pool)
            .await?;
            if waiting == 0 || Instant::now() >= deadline {
                break waiting;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let final_secs = start.elapsed().as_secs_f64();
        let cpu = meter.since(ticks(), total, &[("node client", result.cpu_ms)]);
        let stored: Vec<(String, String)> = sqlx::query_as(
            "SELECT subscription_id, status FROM subscriptions WHERE subscription_id LIKE $1",
        )
        .bind(format!("sub_p{}x%", self.tag))
        .fetch_all(&pool)
        .await?;
        let measured = Measured {
            accepted_secs: result.secs,
            final_secs,
            accepted: result.ok,
            cpu,
            wal: 0.0,
            unfinished,
            first_error: result.first_error,
        };
        Ok(measured.report("scripts/dev", "http", c, total, self.score(&stored)))
    }

    /// billing-inbox: deliveries through the intake's handler (in process, or behind a hyper
    /// server for the node client), the worker's pollers applying what the queue brings
    /// meanwhile, until every event is final.
    async fn ours(&self, mode: &str, c: usize) -> anyhow::Result<Value> {
        eprintln!("bench --peer: billing-inbox, {mode}, c{c}");
        let db = format!("inbox_peer_{}_{c}_{}", self.tag, mode.replace('-', ""));
        let result = self.ours_on(&db, mode, c).await;
        drop_database(self.server, &db).await;
        result
    }

    async fn ours_on(&self, db: &str, mode: &str, c: usize) -> anyhow::Result<Value> {
        let catalog = parse_plans(&self.args.plans)?;
        let pool = fresh_database(
            self.server,
            db,
            shared::platform::database::pool_options(32),
            None,
        )
        .await?;
        let sqs = aws_sdk_sqs::Client::new(&shared::platform::queue::sdk_config().await);
        let queue_url = create_queue(&sqs, &format!("inbox-peer-{}-{db}", self.tag)).await?;
        let configs = [self.source.clone()];
        let mut instances = Vec::with_capacity(c);
        for _ in 0..c {
            let sources =
                Sources::build(&configs, Duration::from_secs(300), reqwest::Client::new())
                    .map_err(|e| anyhow::anyhow!(e))?;
            instances.push(Arc::new(IntakeState::new(
                pool.clone(),
                Queue::new(sqs.clone(), &queue_url),
                sources,
            )));
        }
        let worker = Arc::new(WorkerState::new(
            pool.clone(),
            HashMap::from([(
                self.source.name.clone(),
                WorkerSource::from(self.source.kind),
            )]),
            catalog,
        ));
        let deliveries = signed(&self.workload.bodies, &self.secret);
        let total = deliveries.len();
        let mut named = vec![(
            "inboxctl (intake and worker)",
            Counted::Process("self".into()),
        )];
        if let Some(pid) = &self.sqs_pid {
            named.push(("SQS server", Counted::Process(pid.clone())));
        }
        if let Some(postmaster) = postmaster_of(&pool).await {
            named.push(("Postgres", Counted::Postgres(postmaster)));
        }
        let statements = statements_counted(&pool).await;
        let wal_before = wal_bytes(&pool).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut client_cpu_ms = Vec::new();
        let (accepted_secs, accepted, first_error, start, meter, pollers) = if mode == "http" {
            let addr = serve_intake(instances.clone(), self.source.name.clone()).await?;
            write_file(&self.file, &deliveries)?;
            let mut client = Node::spawn(
                &self.dir,
                "send",
                &[
                    ("PEER_FILE", self.file.display().to_string()),
                    ("PEER_CONCURRENCY", c.to_string()),
                    ("PEER_URL", format!("http://{addr}/webhooks/stripe")),
                ],
            )?;
            named.push(("node client", Counted::Process(client.pid())));
            client.line("start").await?;
            let start = Instant::now();
            let meter = Processes::start(&named);
            let pollers = self.pollers(&worker, &sqs, &queue_url, c, &stop, start);
            let result = node_result(&client.line("{").await?)?;
            client_cpu_ms.push(("node client", result.cpu_ms));
            (
                result.secs,
                result.ok,
                result.first_error,
                start,
                meter,
                pollers,
            )
        } else {
            let start = Instant::now();
            let meter = Processes::start(&named);
            // INTAKE_FIRST: the worker's pollers start at the last answer, so the sending has the
            // cores to itself (as on AWS, where the worker is a function of its own).
            let early = (mode != INTAKE_FIRST)
                .then(|| self.pollers(&worker, &sqs, &queue_url, c, &stop, start));
            let items: Vec<Delivery> = deliveries
                .into_iter()
                .map(|(signature, body)| Delivery {
                    source: self.source.name.clone(),
                    headers: vec![
                        ("content-type".into(), "application/json".into()),
                        (
                            shared::providers::stripe::SIGNATURE_HEADER.into(),
                            signature,
                        ),
                    ],
                    body,
                })
                .collect();
            let instances = Arc::new(instances);
            crate::bench::run_concurrently(items, c, move |slot, d| {
                let state = instances[slot].clone();
                async move { deliver(&state, d).await }
            })
            .await;
            let accepted_secs = start.elapsed().as_secs_f64();
            let pollers =
                early.unwrap_or_else(|| self.pollers(&worker, &sqs, &queue_url, c, &stop, start));
            (accepted_secs, total, None, start, meter, pollers)
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let unfinished = loop {
            let waiting: i64 = sqlx::query_scalar(&format!(
                "SELECT count(*) FROM inbox_events WHERE status IN {WAITING}"
            ))
            .fetch_one(&pool)
            .await?;
            if waiting == 0 || Instant::now() >= deadline {
                break waiting;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let final_secs = start.elapsed().as_secs_f64();
        let cpu = meter.since(ticks(), total, &client_cpu_ms);
        let wal = wal_bytes(&pool).await? - wal_before;
        stop.store(true, Ordering::SeqCst);
        for p in pollers {
            let _ = p.await;
        }
        let _ = sqs.delete_queue().queue_url(&queue_url).send().await;
        let stored: Vec<(String, String)> =
            sqlx::query_as("SELECT subscription_id, status FROM subscriptions")
                .fetch_all(&pool)
                .await?;
        let by_statement = if statements {
            by_statement(&pool, total).await.ok()
        } else {
            None
        };
        pool.close().await;
        // A run's figures stand without its storage; a failed read is said, never hidden.
        let storage = match storage(self.server, db, total).await {
            Ok(storage) => Some(storage),
            Err(e) => {
                eprintln!("bench: the store's bytes per event could not be read: {e:#}");
                None
            }
        };
        let measured = Measured {
            accepted_secs,
            final_secs,
            accepted,
            cpu,
            wal,
            unfinished,
            first_error,
        };
        let mut report = measured.report("billing-inbox", mode, c, total, self.score(&stored));
        report["storage"] = json!(storage);
        report["by_statement"] = json!(by_statement);
        Ok(report)
    }

    fn pollers(
        &self,
        worker: &Arc<WorkerState>,
        sqs: &aws_sdk_sqs::Client,
        queue_url: &str,
        c: usize,
        stop: &Arc<AtomicBool>,
        start: Instant,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        spawn_pollers(
            worker,
            sqs,
            queue_url,
            c,
            start + Duration::from_secs(900),
            Polls::Short,
            (stop.clone(), 1),
            Arc::new(std::sync::Mutex::new((start, ticks()))),
        )
    }

    /// The engine: its migrations on a database of its own, then its `processWebhook` from the
    /// node driver, or behind the node server for the node client. It applies inside the
    /// request, so a delivery accepted is final.
    async fn engine(&self, mode: &str, c: usize) -> anyhow::Result<Value> {
        eprintln!("bench --peer: the Stripe sync engine, {mode}, c{c}");
        let db = format!(
            "inbox_peer_engine_{}_{c}_{}",
            self.tag,
            mode.replace('-', "")
        );
        let result = self.engine_on(&db, mode, c).await;
        drop_database(self.server, &db).await;
        result
    }

    async fn engine_on(&self, db: &str, mode: &str, c: usize) -> anyhow::Result<Value> {
        let admin = PgPool::connect(self.server).await?;
        sqlx::raw_sql(&format!(r#"CREATE DATABASE "{db}""#))
            .execute(&admin)
            .await?;
        let url = {
            let mut u = url::Url::parse(self.server).context("DATABASE_URL")?;
            u.set_path(db);
            u.to_string()
        };
        let env = |extra: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
            let mut all = vec![
                ("PEER_DATABASE_URL", url.clone()),
                ("PEER_SECRET", self.secret.clone()),
                ("PEER_CONCURRENCY", c.to_string()),
                ("PEER_FILE", self.file.display().to_string()),
            ];
            all.extend(extra.iter().cloned());
            all
        };
        let mut migrate = Node::spawn(&self.dir, "migrate", &env(&[]))?;
        migrate.line("migrated").await?;
        let _ = migrate.child.wait().await;
        let deliveries = signed(&self.workload.bodies, &self.secret);
        let total = deliveries.len();
        write_file(&self.file, &deliveries)?;
        let wal_before = wal_bytes(&admin).await?;
        let postmaster = postmaster_of(&admin).await;
        let (result, cpu) = if mode == "http" {
            let port = free_port()?;
            let mut server =
                Node::spawn(&self.dir, "serve", &env(&[("PEER_PORT", port.to_string())]))?;
            server.line("listening").await?;
            let mut client = Node::spawn(
                &self.dir,
                "send",
                &env(&[(
                    "PEER_URL",
                    format!("http://127.0.0.1:{port}/webhooks/stripe"),
                )]),
            )?;
            let mut named = vec![
                ("node server (the engine)", Counted::Process(server.pid())),
                ("node client", Counted::Process(client.pid())),
            ];
            named.extend(postmaster.map(|p| ("Postgres", Counted::Postgres(p))));
            client.line("start").await?;
            let meter = Processes::start(&named);
            let line = client.line("{").await?;
            let cpu = meter.since(ticks(), total, &[]);
            let _ = server.child.start_kill();
            let _ = server.child.wait().await;
            (node_result(&line)?, cpu)
        } else {
            let mut driver = Node::spawn(&self.dir, "inproc", &env(&[]))?;
            let mut named = vec![("node (the engine)", Counted::Process(driver.pid()))];
            named.extend(postmaster.map(|p| ("Postgres", Counted::Postgres(p))));
            driver.line("start").await?;
            let meter = Processes::start(&named);
            let line = driver.line("{").await?;
            let cpu = meter.since(ticks(), total, &[]);
            let _ = driver.child.wait().await;
            (node_result(&line)?, cpu)
        };
        let wal = wal_bytes(&admin).await? - wal_before;
        admin.close().await;
        let pool = PgPool::connect(&url).await?;
        let stored: Vec<(String, String)> =
            sqlx::query_as("SELECT id, status::text FROM stripe.subscriptions")
                .fetch_all(&pool)
                .await?;
        pool.close().await;
        let measured = Measured {
            accepted_secs: result.secs,
            final_secs: result.secs,
            accepted: result.ok,
            cpu,
            wal,
            unfinished: 0,
            first_error: result.first_error,
        };
        Ok(measured.report("engine", mode, c, total, self.score(&stored)))
    }
}

/// The machine's load averages (1, 5 and 15 minutes), from /proc/loadavg: the machine may be
/// shared, and the figures say so.
fn load_average() -> Value {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!(load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" "))
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// The intake's handler behind a plain hyper server on loopback: each connection takes an
/// instance of its own (as one Lambda instance answers one request at a time), round robin.
async fn serve_intake(
    instances: Vec<Arc<IntakeState>>,
    source: String,
) -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let mut slot = 0;
    let round_robin = move || {
        let state = instances[slot].clone();
        slot = (slot + 1) % instances.len();
        state
    };
    bench_serve::serve(listener, round_robin, move |state, request| {
        answer(state, source.clone(), request)
    });
    Ok(addr)
}

async fn answer(
    state: Arc<IntakeState>,
    source: String,
    request: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return hyper::Response::builder()
                .status(400)
                .body(Full::new(Bytes::new()))
                .unwrap_or_default()
        }
    };
    let mut builder = http::Request::builder()
        .method("POST")
        .uri(format!("/webhooks/{source}"));
    for (k, v) in &parts.headers {
        builder = builder.header(k, v);
    }
    let Ok(lambda_request) = builder.body(lambda_http::Body::from(body.to_vec())) else {
        return hyper::Response::builder()
            .status(400)
            .body(Full::new(Bytes::new()))
            .unwrap_or_default();
    };
    let response = shared::handlers::intake::handle(&state, lambda_request).await;
    let status = response.status();
    let bytes = match response.into_body() {
        lambda_http::Body::Empty => Bytes::new(),
        lambda_http::Body::Text(t) => Bytes::from(t),
        lambda_http::Body::Binary(b) => Bytes::from(b),
        _ => Bytes::new(),
    };
    hyper::Response::builder()
        .status(status)
        .body(Full::new(bytes))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An index of one partition alone (the kept partition's finished events) has no
    /// partition root: its bytes are read under its own name, and the storage is reported.
    #[sqlx::test(migrator = "shared::MIGRATOR")]
    async fn the_storage_names_every_part_of_the_store_an_index_of_one_partition_too(pool: PgPool) {
        let storage = storage_of(&pool, 0).await.expect("the storage is read");
        let parts = storage["parts"].as_array().expect("parts");
        let names: Vec<&str> = parts.iter().filter_map(|p| p["part"].as_str()).collect();
        assert_eq!(names.len(), parts.len(), "every part named: {parts:?}");
        assert!(names.contains(&"inbox_events_kept_finished"), "{names:?}");
    }

    #[test]
    fn the_histories_start_hours_ago_in_this_month() {
        let at = |s: &str| s.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
        assert_eq!(
            recent_start(at("2026-12-06T20:00:00Z")),
            at("2026-12-06T16:00:00Z").timestamp()
        );
        assert_eq!(
            recent_start(at("2026-12-01T01:00:00Z")),
            at("2026-12-01T00:00:00Z").timestamp()
        );
    }

    #[test]
    fn a_same_second_pair_ends_on_the_update_and_a_history_on_its_newest_event() {
        let events = histories(10, 1_700_000_000, "peer");
        let expected = expected(&events);
        let pairs: Vec<_> = expected.iter().filter(|(_, (_, p))| *p).collect();
        let spread: Vec<_> = expected.iter().filter(|(_, (_, p))| !*p).collect();
        assert!(!pairs.is_empty() && !spread.is_empty());
        assert!(pairs.iter().all(|(_, (status, _))| *status == "active"));
        assert!(spread.iter().all(|(_, (status, _))| *status == "past_due"));
    }

    #[test]
    fn a_payload_is_the_corpus_event_with_its_own_ids_status_and_previous_status() {
        let e = SubEvent {
            id: "evt_x".into(),
            subscription: "sub_peer1p".into(),
            created: 1_700_000_123,
            status: "active",
            previous: Some("incomplete"),
        };
        let p = payload(&e, "price_pro").unwrap();
        assert_eq!(p["api_version"], API_VERSION);
        assert_eq!(p["type"], "customer.subscription.updated");
        assert_eq!(p["data"]["object"]["id"], "sub_peer1p");
        assert_eq!(p["data"]["object"]["customer"], "cus_peer1p");
        assert_eq!(p["data"]["previous_attributes"]["status"], "incomplete");
        assert_eq!(
            p["data"]["object"]["items"]["data"][0]["price"]["id"],
            "price_pro"
        );
        let created = payload(
            &SubEvent {
                previous: None,
                ..e
            },
            "price_pro",
        )
        .unwrap();
        assert_eq!(created["type"], "customer.subscription.created");
        assert!(created["data"].get("previous_attributes").is_none());
    }
}
