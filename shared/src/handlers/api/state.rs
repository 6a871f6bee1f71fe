//! The app API's state: what an instance builds once, at cold start, and the clock it reads
//! the current month from (`platform::clock`).

use sqlx::PgPool;

use crate::audit;
use crate::domain::{Catalog, SourceKind};
use crate::platform::api_keys::Keys;
pub use crate::platform::clock::{Clock, SetClock};
use crate::platform::config::ApiConfig;
use crate::platform::db::Held;
use crate::platform::queue::Queue;

pub struct ApiState {
    /// The instance's own connection: one round trip per read.
    pub conn: Held,
    /// For what is rare (unmarking an effect the queue refused).
    pub pool: PgPool,
    pub sources: Vec<(String, SourceKind)>,
    /// The same sources with their Stripe modes, as the fold `…/why` explains takes them.
    pub fold_sources: audit::Sources,
    pub catalog: Catalog,
    pub keys: Keys,
    /// Effects on: the queue an `allowance_exhausted` effect's id is handed to.
    pub effects: Option<Queue>,
    /// The dispatcher's queue, whenever it is configured: a debit's meter report is handed
    /// to it.
    pub outbox: Option<Queue>,
    /// Each metered source's meter, by source name (docs/design.md §4.13).
    pub meters: std::collections::HashMap<String, String>,
    /// The worker's queue a replay hands its events to; without one, the rescue sends them.
    pub events: Option<Queue>,
    /// Hours without a delivery after which the overview names a source as silent.
    pub silent_hours: f64,
    /// What precedes `/console` in the console's links besides what the path shows
    /// (`INBOX_CONSOLE_BASE`).
    pub console_base: String,
    /// The Engine Room, when the deployment turns it on (`INBOX_ENGINE_ROOM`).
    pub engine_room: Option<crate::handlers::engine_room::EngineRoom>,
    /// The current month's clock.
    pub clock: Clock,
}

impl ApiState {
    /// Builds the connection settings, reads the keys (from their secret, when they are in
    /// one) and the effects queue once, at cold start; nothing connects to Postgres before
    /// the first request.
    pub async fn from_config(config: &ApiConfig) -> anyhow::Result<Self> {
        crate::providers::check_sources(&config.sources)?;
        let database = crate::platform::database::Database::open(&config.database).await?;
        let pool = database.pool(1);
        let entries = crate::platform::secrets::resolve_api_keys(&config.keys).await?;
        let outbox = match &config.outbox_queue_url {
            Some(url) => Some(Queue::from_env(url.clone()).await),
            None => None,
        };
        let effects = match &config.effects {
            Some(effects) if config.outbox_queue_url.as_ref() == Some(&effects.queue_url) => {
                outbox.clone()
            }
            Some(effects) => Some(Queue::from_env(effects.queue_url.clone()).await),
            None => None,
        };
        Ok(Self {
            conn: Held::on(database),
            pool,
            sources: config
                .sources
                .iter()
                .map(|s| (s.name.clone(), s.kind))
                .collect(),
            fold_sources: audit::sources_of(&config.sources),
            catalog: config.catalog.clone(),
            keys: Keys::new(&entries),
            effects,
            outbox,
            meters: config
                .sources
                .iter()
                .filter_map(|s| Some((s.name.clone(), s.meter.as_ref()?.name()?.to_owned())))
                .collect(),
            events: match &config.queue_url {
                Some(url) => Some(Queue::from_env(url.clone()).await),
                None => None,
            },
            silent_hours: config.source_silent_hours,
            console_base: config.console_base.clone(),
            engine_room: crate::handlers::engine_room::EngineRoom::open(config).await?,
            clock: Clock::System,
        })
    }
}
