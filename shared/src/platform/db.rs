//! The Postgres pool, built once per cold start, and how every statement of the functions is
//! sent ([`exec`]): named and cached on a direct connection, unnamed through a
//! transaction-mode pooler (`DATABASE_POOLER=transaction`, docs/design.md §5.3).

use std::str::FromStr;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use sqlx::postgres::{
    PgArguments, PgConnectOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo,
};
use sqlx::{
    ConnectOptions, Connection, Describe, Either, Execute, Executor, PgConnection, PgPool, Postgres,
};
use tokio::sync::{Mutex, MutexGuard};

use crate::platform::database::{
    pool_options, sends_unnamed_statements, Database, CONNECT_TIMEOUT,
};

/// A pool that connects on first use, so that a function starts (and answers 503) while
/// Postgres is down, and gives up on a connection quickly instead of holding the caller.
pub fn lazy_pool(database_url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let options = PgConnectOptions::from_str(database_url)?;
    Ok(pool_options(max_connections).connect_lazy_with(options))
}

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

/// The executor every statement of the functions runs on: `executor` (a connection, or a
/// pool) as it is on a direct connection, where each statement is prepared once per
/// connection under a name, cached, and then costs one round trip; with
/// [`send_unnamed_statements`](crate::platform::database::send_unnamed_statements), unnamed and inside a transaction (its own when there is none:
/// `BEGIN`, two round trips for the statement, `COMMIT`), so that nothing of it outlives the
/// transaction on the server connection.
pub fn exec<E>(executor: E) -> Exec<E> {
    Exec(executor)
}

/// See [`exec`].
#[derive(Debug)]
pub struct Exec<E>(E);

/// A statement as given, but not persistent: sqlx sends it as the unnamed statement.
struct Unnamed<Q>(Q);

impl<'q, Q: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<Q> {
    fn sql(&self) -> &'q str {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement<'q>> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, sqlx::error::BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

type Results = Vec<Either<PgQueryResult, PgRow>>;

/// `query`, unnamed, in the transaction `conn` is in, or in one of its own.
async fn all_unnamed<'q, Q>(conn: &mut PgConnection, query: Q) -> Result<Results, sqlx::Error>
where
    Q: 'q + Execute<'q, Postgres>,
{
    if conn.is_in_transaction() {
        return conn.fetch_many(Unnamed(query)).try_collect().await;
    }
    let mut tx = conn.begin().await?;
    let results = tx.fetch_many(Unnamed(query)).try_collect().await;
    settled(tx, results).await
}

/// `query`'s first row, unnamed, in the transaction `conn` is in, or in one of its own.
async fn optional_unnamed<'q, Q>(
    conn: &mut PgConnection,
    query: Q,
) -> Result<Option<PgRow>, sqlx::Error>
where
    Q: 'q + Execute<'q, Postgres>,
{
    if conn.is_in_transaction() {
        return conn.fetch_optional(Unnamed(query)).await;
    }
    let mut tx = conn.begin().await?;
    let row = tx.fetch_optional(Unnamed(query)).await;
    settled(tx, row).await
}

/// The statement's own transaction committed, or rolled back now when the statement failed:
/// left to sqlx, the rollback would wait for the connection's next use, maybe the next
/// invocation, and the pooler's server connection with it.
async fn settled<T>(
    tx: sqlx::Transaction<'_, Postgres>,
    result: Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    match result {
        Ok(value) => {
            tx.commit().await?;
            Ok(value)
        }
        Err(error) => {
            // The statement's error is the answer; a rollback that fails too adds nothing.
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}

fn streamed<'e>(
    results: impl std::future::Future<Output = Result<Results, sqlx::Error>> + Send + 'e,
) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>> {
    stream::once(results)
        .map_ok(|results| stream::iter(results.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
}

impl<'c> Executor<'c> for Exec<&'c mut PgConnection> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, Q>(
        self,
        query: Q,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'c: 'e,
        Q: 'q + Execute<'q, Postgres>,
    {
        if !sends_unnamed_statements() {
            return self.0.fetch_many(query);
        }
        streamed(all_unnamed(self.0, query))
    }

    fn fetch_optional<'e, 'q: 'e, Q>(
        self,
        query: Q,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'c: 'e,
        Q: 'q + Execute<'q, Postgres>,
    {
        if !sends_unnamed_statements() {
            return self.0.fetch_optional(query);
        }
        Box::pin(optional_unnamed(self.0, query))
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.0.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.0.describe(sql)
    }
}

impl<'p> Executor<'p> for Exec<&'p PgPool> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, Q>(
        self,
        query: Q,
    ) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        Q: 'q + Execute<'q, Postgres>,
    {
        if !sends_unnamed_statements() {
            return self.0.fetch_many(query);
        }
        let pool = self.0;
        streamed(async move { all_unnamed(&mut *pool.acquire().await?, query).await })
    }

    fn fetch_optional<'e, 'q: 'e, Q>(
        self,
        query: Q,
    ) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        Q: 'q + Execute<'q, Postgres>,
    {
        if !sends_unnamed_statements() {
            return self.0.fetch_optional(query);
        }
        let pool = self.0;
        Box::pin(async move { optional_unnamed(&mut *pool.acquire().await?, query).await })
    }

    fn prepare_with<'e, 'q: 'e>(
        self,
        sql: &'q str,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement<'q>, sqlx::Error>>
    where
        'p: 'e,
    {
        self.0.prepare_with(sql, parameters)
    }

    fn describe<'e, 'q: 'e>(
        self,
        sql: &'q str,
    ) -> BoxFuture<'e, Result<Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        self.0.describe(sql)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every statement the functions run goes through [`super::exec`], or a transaction-mode
    /// pooler meets a named statement (tests/api/pooler.rs runs the pipeline through one; this
    /// catches a statement on a path it does not take): in each source file, as many
    /// `sqlx::query…` as `(exec(`.
    #[test]
    fn every_statement_runs_on_exec() {
        fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut paths = Vec::new();
        files(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut paths,
        );
        let mut counted = 0;
        for path in paths {
            // schema.rs is the migrate function's: it holds sqlx's session lock, so it runs
            // on a session of its own, never through a transaction-mode pooler (its host is
            // the database's own, docs/deploy.md, Migrations).
            if path.ends_with("db.rs") || path.ends_with("schema.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let statements = text.matches("sqlx::query").count();
            let on_exec = text.matches("(exec(").count();
            assert_eq!(
                statements,
                on_exec,
                "{}: every sqlx::query… runs on shared::platform::db::exec",
                path.display()
            );
            counted += statements;
        }
        assert!(counted > 50, "the statements were found: {counted}");
    }
}
