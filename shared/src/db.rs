//! The Postgres pool, built once per cold start.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgConnection, PgPool};
use tokio::sync::{Mutex, MutexGuard};

use crate::database::Database;

/// A pool that connects on first use, so that a function starts (and answers 503) while
/// Postgres is down, and gives up on a connection quickly instead of holding the caller.
pub fn lazy_pool(database_url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let options = PgConnectOptions::from_str(database_url)?;
    Ok(pool_options(max_connections).connect_lazy_with(options))
}

pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(3))
        // Lambda freezes idle instances; a connection found dead is replaced, not used.
        .test_before_acquire(true)
        .idle_timeout(Duration::from_secs(300))
}

/// How long opening a connection may take before the caller is answered without one.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The one connection a function instance keeps across invocations, used without the pool's
/// pings (a ping before each use and one after: two extra round trips per statement). A
/// Lambda instance handles one request at a time, so it needs no more; concurrent callers in
/// one process take turns. It opens on first use; the caller drops it when a statement finds
/// it broken (an instance frozen while Postgres or a proxy closed it) and tries once more on
/// a new one (docs/design.md §8).
pub struct Held {
    database: Arc<Database>,
    conn: Mutex<Option<PgConnection>>,
    #[cfg(feature = "dev")]
    before_use: Option<BeforeUse>,
}

/// A statement the simulator runs on the held connection before each use (it sets the
/// simulated clock, docs/design.md §3.12), as its pools do on acquire.
#[cfg(feature = "dev")]
pub type BeforeUse = std::sync::Arc<
    dyn for<'c> Fn(&'c mut PgConnection) -> crate::BoxFuture<'c, Result<(), sqlx::Error>>
        + Send
        + Sync,
>;

impl Held {
    /// A held connection with fixed options (tests, tools).
    pub fn new(options: PgConnectOptions) -> Self {
        Self::on(Database::fixed(options))
    }

    /// A held connection that takes `database`'s options at each connect, the new ones after
    /// a rotation included.
    pub fn on(database: Arc<Database>) -> Self {
        Self {
            database,
            conn: Mutex::new(None),
            #[cfg(feature = "dev")]
            before_use: None,
        }
    }

    #[cfg(feature = "dev")]
    pub fn before_use(mut self, hook: BeforeUse) -> Self {
        self.before_use = Some(hook);
        self
    }

    pub fn from_url(database_url: &str) -> Result<Self, sqlx::Error> {
        Ok(Self::new(PgConnectOptions::from_str(database_url)?))
    }

    /// Where its options come from.
    pub fn database(&self) -> &Arc<Database> {
        &self.database
    }

    /// The connection, for this caller alone until the guard is dropped.
    pub async fn lock(&self) -> HeldConnection<'_> {
        HeldConnection {
            held: self,
            slot: self.conn.lock().await,
        }
    }
}

async fn connect(database: &Database) -> Result<PgConnection, sqlx::Error> {
    tokio::time::timeout(CONNECT_TIMEOUT, database.options().connect())
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)?
}

pub struct HeldConnection<'a> {
    held: &'a Held,
    slot: MutexGuard<'a, Option<PgConnection>>,
}

impl HeldConnection<'_> {
    /// The open connection, or a new one.
    pub async fn get(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        if self.slot.is_none() {
            let database = &self.held.database;
            let generation = database.generation();
            let conn = match connect(database).await {
                // A refused login after a rotation: the secret is read again, and the
                // connection tried once more with what it holds.
                Err(error) if database.after_connect_error(&error, generation).await => {
                    connect(database).await?
                }
                other => other?,
            };
            *self.slot = Some(conn);
        }
        #[cfg(feature = "dev")]
        if let Some(hook) = &self.held.before_use {
            let conn = self.slot.as_mut().expect("just opened");
            if let Err(error) = hook(conn).await {
                // A connection that cannot run the hook is broken: the next use opens another.
                *self.slot = None;
                return Err(error);
            }
        }
        Ok(self.slot.as_mut().expect("just opened"))
    }

    /// Forgets a connection found broken: the next `get` opens another.
    pub fn discard(&mut self) {
        *self.slot = None;
    }
}
