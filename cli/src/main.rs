//! inboxctl: operate and develop billing-inbox.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::json;

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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply the schema migrations to DATABASE_URL.
    Migrate {
        /// Postgres connection string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if cli.json {
                println!("{}", json!({"error": format!("{e:#}")}));
            } else {
                eprintln!("error: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: &Cli) -> anyhow::Result<()> {
    match &cli.command {
        Command::Migrate { database_url } => migrate(database_url, cli.json).await,
    }
}

async fn migrate(database_url: &str, json_output: bool) -> anyhow::Result<()> {
    let pool = inbox::db::pool_options(1)
        .connect(database_url)
        .await
        .context("connecting to DATABASE_URL")?;
    let before = applied_versions(&pool).await?;
    inbox::MIGRATOR
        .run(&pool)
        .await
        .context("applying migrations")?;
    let after = applied_versions(&pool).await?;
    let new: Vec<i64> = after
        .iter()
        .copied()
        .filter(|v| !before.contains(v))
        .collect();
    if json_output {
        println!("{}", json!({"applied": new, "total": after.len()}));
    } else if new.is_empty() {
        println!("schema is up to date ({} migrations)", after.len());
    } else {
        println!(
            "applied {} migration(s): {:?}; {} in all",
            new.len(),
            new,
            after.len()
        );
    }
    Ok(())
}

/// Versions recorded by earlier runs; none when the table does not exist yet.
async fn applied_versions(pool: &sqlx::PgPool) -> anyhow::Result<Vec<i64>> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await
        .context("reading the migration table")?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
        .fetch_all(pool)
        .await
        .context("reading the migration table")
}
