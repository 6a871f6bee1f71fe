//! inboxctl: operate and develop billing-inbox.

#[macro_use]
mod output;

mod api_key;
mod bench;
mod bench_api;
mod bench_budget;
mod bench_meters;
mod bench_peer;
mod bench_scratch;
mod bench_serve;
mod delay;
mod dev;
mod differences;
mod effects;
mod fakes;
mod features;
mod listen;
mod meters;
mod migrate;
mod replay;
mod scenario;
mod send;
mod show;
mod usage;
mod why;

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::json;
use sqlx::PgPool;

#[derive(Parser)]
#[command(
    name = "inboxctl",
    version,
    about = "Operate and develop billing-inbox"
)]
struct Cli {
    /// Print machine-readable JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Postgres connection string (without it: the secret DATABASE_SECRET_ID names).
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply the schema migrations to DATABASE_URL.
    Migrate,
    /// Why is this customer on this plan? Plan, subscriptions, payments, balance and event log.
    Account {
        customer_id: String,
        #[command(flatten)]
        account: usage::AccountArgs,
        /// Show only the log's latest N lines (0: all). Default: 100 in text, all in JSON.
        #[arg(long, value_name = "N")]
        log: Option<u32>,
    },
    /// What the customer may use: each feature with its value, where it comes from (the
    /// catalog or a provider's entitlement) and the event behind it.
    Features(features::FeaturesArgs),
    /// Each field of the account as its kept events give it: the event that decided it, those
    /// it beat and why, and any register that differs (`--at`, `--received-before`: as then).
    Why(why::WhyArgs),
    /// Compare the registers with the fold of their accounts' events; exit 1 if any differs.
    Audit(why::AuditArgs),
    /// List stored events, newest first.
    Events {
        #[arg(long)]
        status: Option<String>,
        #[arg(long)]
        source: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// One stored event with its deliveries.
    Event { id: i64 },
    /// Counts by status, backlog age, copies per event, delivery lag.
    Stats,
    /// Put events back to `received` and enqueue them (applying again is harmless).
    Replay {
        /// Event ids to replay.
        ids: Vec<i64>,
        /// Replay every event in this status (e.g. dead).
        #[arg(long, conflicts_with = "ids")]
        status: Option<String>,
        /// With --status: only this source's events.
        #[arg(long, requires = "status")]
        source: Option<String>,
        /// The queue to send to.
        #[arg(long, env = "QUEUE_URL")]
        queue_url: String,
    },
    /// List effects (what changed, told to the app), newest first; `effects replay` sends
    /// them again.
    Effects(effects::EffectsArgs),
    /// One effect: its cause, attempts, last error and the body the sinks receive.
    Effect { id: String },
    /// List meter reports (debits told to the provider's meter), newest first; `meters
    /// replay` sends dead ones again, `meters audit` compares them with the provider's totals.
    Meters(meters::MetersArgs),
    /// The provider audits' open differences: meter totals and Stripe credit balances that
    /// differ from ours, oldest first.
    Differences,
    /// Build, sign and POST a realistic delivery to the intake.
    Send(send::SendArgs),
    /// Run a reference delivery script against the running stack and print its timeline.
    Scenario(scenario::ScenarioArgs),
    /// Measure intake and worker throughput against the raw SQL they run, and the drain time
    /// of a backlog (in databases and a queue of its own, removed afterwards).
    Bench(bench::BenchArgs),
    /// Play the AWS event source mapping and schedule for the local stack: long-poll the
    /// queue and invoke the worker, and invoke the scheduler on an interval.
    Dev(dev::DevArgs),
    /// Receive effects locally as the app would: verify each signature, print each effect.
    Listen(listen::ListenArgs),
    /// Serve the provider fakes (Stripe, Polar, Kinde, Paddle, Lemon Squeezy) on loopback,
    /// one port each from --port, every request checked against the provider's description.
    Fakes(fakes::FakesArgs),
    /// Keys for the app API: `api-key new --name app --scopes read,usage`.
    ApiKey(api_key::ApiKeyArgs),
    /// A period's usage of the allowance (`usage <customer>`), or spend it (`usage record`).
    Usage(usage::UsageArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    // Logs to stderr (INBOXCTL_LOG, default warn); `bench` also counts sqlx's statements.
    let counter = bench::StatementCounter::default();
    let log_filter = tracing_subscriber::EnvFilter::try_from_env("INBOXCTL_LOG")
        .unwrap_or_else(|_| "warn".into());
    let statements = tracing_subscriber::filter::Targets::new()
        .with_target("sqlx::query", tracing::Level::DEBUG);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(log_filter),
        )
        .with(counter.clone().with_filter(statements))
        .init();
    // What the functions' code prints as metrics (EMF) goes to stderr here: stdout is
    // inboxctl's answer (`--json`).
    shared::platform::metrics::print_to_stderr();
    let cli = Cli::parse();
    match run(&cli, &counter).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A debit answered but not accepted says which answer, in JSON and exit code.
            let refused = e.downcast_ref::<usage::Refused>();
            // The audit's JSON already says what differs, and send's what the intake
            // answered; the exit code says that it went wrong.
            let diverged = e.downcast_ref::<why::Diverged>().is_some()
                || e.downcast_ref::<meters::Differ>().is_some()
                || e.downcast_ref::<send::Refused>().is_some();
            match (cli.json, diverged) {
                (true, true) => {}
                (true, false) => {
                    let mut error = json!({"error": format!("{e:#}")});
                    if let Some(r) = refused {
                        error["code"] = json!(r.code);
                        if let Some(remaining) = r.remaining {
                            error["remaining"] = json!(remaining);
                        }
                    }
                    out!("{error}");
                }
                (false, _) => eprintln!("error: {e:#}"),
            }
            refused.map_or(ExitCode::FAILURE, |r| ExitCode::from(r.exit))
        }
    }
}

async fn run(cli: &Cli, counter: &bench::StatementCounter) -> anyhow::Result<()> {
    match &cli.command {
        Command::Migrate => migrate::run(&connect(cli).await?, cli.json).await,
        Command::Account {
            customer_id,
            account,
            log,
        } => {
            show::account(
                &connect(cli).await?,
                &account.stored_customer(customer_id)?,
                account.source.as_deref(),
                account.period.as_deref(),
                *log,
                cli.json,
            )
            .await
        }
        Command::Features(args) => features::run(args, &connect(cli).await?, cli.json).await,
        Command::Why(args) => why::why(args, &connect(cli).await?, cli.json).await,
        Command::Audit(args) => why::audit(args, &connect(cli).await?, cli.json).await,
        Command::Events {
            status,
            source,
            limit,
        } => {
            show::events(
                &connect(cli).await?,
                status.as_deref(),
                source.as_deref(),
                *limit,
                cli.json,
            )
            .await
        }
        Command::Event { id } => show::event(&connect(cli).await?, *id, cli.json).await,
        Command::Stats => show::stats(&connect(cli).await?, cli.json).await,
        Command::Replay {
            ids,
            status,
            source,
            queue_url,
        } => {
            replay::run(
                &connect(cli).await?,
                ids,
                status.as_deref(),
                source.as_deref(),
                queue_url,
                cli.json,
            )
            .await
        }
        Command::Effects(args) => effects::run(args, &connect(cli).await?, cli.json).await,
        Command::Effect { id } => effects::show(&connect(cli).await?, id, cli.json).await,
        Command::Meters(args) => meters::run(args, &connect(cli).await?, cli.json).await,
        Command::Differences => differences::run(&connect(cli).await?, cli.json).await,
        Command::Send(args) => send::run(args, cli.json).await,
        Command::Dev(args) => dev::run(args).await,
        Command::Listen(args) => listen::run(args, cli.json).await,
        Command::Fakes(args) => fakes::run(args).await,
        Command::ApiKey(args) => api_key::run(args, cli.json),
        Command::Bench(args) => {
            let server = cli
                .database_url
                .as_deref()
                .context("DATABASE_URL is not set (or pass --database-url)")?;
            if args.api {
                bench_api::run(args, server, counter, cli.json).await
            } else if args.peer {
                bench_peer::run(args, server, cli.json).await
            } else if let Some(events) = args.budget {
                bench_budget::run(args, events, server, cli.json).await
            } else if let Some(reports) = args.meters {
                bench_meters::run(args, reports, server, cli.json).await
            } else {
                bench::run(args, server, counter, cli.json).await
            }
        }
        Command::Scenario(args) => scenario::run(args, &connect(cli).await?, cli.json).await,
        Command::Usage(args) => usage::run(args, &connect(cli).await?, cli.json).await,
    }
}

/// The database: `DATABASE_URL` (or `--database-url`), or, as a deployed stack's functions
/// find it, the secret `DATABASE_SECRET_ID` names with `DATABASE_HOST`/`PORT`/`NAME` and
/// `DATABASE_CA_FILE` beside it (docs/deploy.md, *Operating a deployed stack*): an operator's
/// shell needs only AWS credentials and a route to the database, never the password.
async fn connect(cli: &Cli) -> anyhow::Result<PgPool> {
    if let Some(url) = cli.database_url.as_deref() {
        return shared::platform::database::pool_options(2)
            .connect(url)
            .await
            .context("connecting to DATABASE_URL");
    }
    if std::env::var_os(shared::platform::config::DATABASE_SECRET_VAR).is_none() {
        anyhow::bail!("DATABASE_URL is not set (or pass --database-url, or set DATABASE_SECRET_ID to the database's secret)");
    }
    let config = shared::platform::config::DatabaseConfig::read(|var| std::env::var(var).ok())?;
    let database = shared::platform::database::Database::open(&config).await?;
    shared::platform::database::pool_options(2)
        .connect_with(database.options())
        .await
        .context("connecting to the database DATABASE_SECRET_ID names")
}
