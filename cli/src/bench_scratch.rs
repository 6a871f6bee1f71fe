//! A bench's scratch database (`inboxctl bench --budget`, `--meters`): made for one run,
//! migrated, seeded with customers on the bench's plan as the intake and the worker store
//! them, and dropped when the run ends, whatever came of it.

use std::future::Future;

use sqlx::PgPool;

use shared::domain::{Catalog, CustomerId};
use shared::platform::config::SourceConfig;

use crate::bench::{drop_database, fresh_database};
use crate::bench_api::seed;

/// One run's database, `inbox_{kind}bench_{tag}`, not made yet.
pub(crate) struct Scratch {
    server: String,
    name: String,
    /// Names the run's other scratch things (its queues) after the same run.
    pub(crate) tag: String,
}

/// The scratch database made and seeded.
pub(crate) struct Seeded {
    pub(crate) pool: PgPool,
    /// The customers seeded on the bench's plan, the hot one last.
    pub(crate) customers: Vec<CustomerId>,
}

/// What a scratch database is seeded with: `customers` customers (and a hot one) of `source`,
/// as `configs` (INBOX_SOURCES) verify them, on the bench's plan of `catalog`.
pub(crate) struct Seed<'a> {
    pub(crate) sender: &'a crate::send::Sender,
    pub(crate) source: &'a SourceConfig,
    pub(crate) configs: &'a [SourceConfig],
    pub(crate) catalog: &'a Catalog,
    pub(crate) customers: usize,
}

/// Runs `run` on a scratch database of its own on `server` (`kind` names the bench in the
/// database's name), then drops the database.
pub(crate) async fn with_scratch_database<T, F, Fut>(
    server: &str,
    kind: &str,
    run: F,
) -> anyhow::Result<T>
where
    F: FnOnce(Scratch) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let name = format!("inbox_{kind}bench_{tag}");
    let scratch = Scratch {
        server: server.to_owned(),
        name: name.clone(),
        tag,
    };
    let result = run(scratch).await;
    drop_database(server, &name).await;
    result
}

impl Scratch {
    /// Makes and migrates the database, with a pool of `connections`, and seeds it.
    pub(crate) async fn seeded(
        &self,
        connections: u32,
        seed_with: Seed<'_>,
    ) -> anyhow::Result<Seeded> {
        let options = shared::platform::database::pool_options(connections);
        let pool = fresh_database(&self.server, &self.name, options, None).await?;
        let Seed {
            sender,
            source,
            configs,
            catalog,
            customers,
        } = seed_with;
        eprintln!(
            "bench: seeding {} customers on '{}' in {}",
            customers + 1,
            source.name,
            self.name
        );
        let customers = seed(sender, source, configs, &pool, catalog, customers).await?;
        Ok(Seeded { pool, customers })
    }
}
