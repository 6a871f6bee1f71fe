//! The schema's one writer in a deployed stack: [`MIGRATOR`] applied to a database under
//! sqlx's advisory lock, what it applied, and why it could not, in words that name the
//! migration and quote the database (docs/design.md §2.2). The migrate function calls it on
//! every deploy; `inboxctl migrate` runs the same migrator locally.

use sqlx::migrate::{Migrate, MigrateError, Migration};
use sqlx::PgConnection;

use crate::MIGRATOR;

/// One migration, as the release knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub version: i64,
    pub description: String,
}

/// What a run found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Applied by this run, oldest first (empty: the schema was up to date).
    pub now: Vec<Version>,
    /// How many migrations the database has applied, this run's included.
    pub total: usize,
    /// The newest migration the database has applied.
    pub latest: Option<Version>,
}

/// Why a run stopped. Each migration commits on its own, so the ones before the failing one
/// stay applied and the next run starts from it.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("migration {} ({}) failed and was rolled back: {database}", .migration.version, .migration.description)]
    Failed {
        migration: Version,
        /// What Postgres said: its message and SQLSTATE, never a value of a row.
        database: String,
    },
    /// A `-- no-transaction` migration cannot be rolled back: what it did before the error
    /// stays (ours are written to be run again, `IF NOT EXISTS`).
    #[error("migration {} ({}) failed outside a transaction (it is marked no-transaction; what it did before the error stays, and it runs again next time): {database}", .migration.version, .migration.description)]
    FailedOutsideTransaction {
        migration: Version,
        database: String,
    },
    #[error("migration {} ({}) is applied with other content than this release's: an applied migration was edited (migrations are forward-only: undo the edit, and change the schema in a new migration)", .0.version, .0.description)]
    Modified(Version),
    #[error("the database has migration {0} applied, which this release does not have: a newer release applied it (deploy that release or a later one)")]
    Unknown(i64),
    #[error("migration {0} is recorded as partially applied; repair it by hand, then delete its row from _sqlx_migrations")]
    Dirty(i64),
    #[error("the migrations could not be applied: {0}")]
    Database(String),
}

/// Applies every migration the database does not have yet, oldest first, and says which.
/// Two runs at once take turns on sqlx's advisory lock (taken here around the reads, and
/// again, reentrantly, by the migrator itself); an up-to-date database is left as it is.
#[tracing::instrument(skip_all)]
pub async fn apply(conn: &mut PgConnection) -> Result<Applied, SchemaError> {
    conn.lock().await.map_err(classify)?;
    // sqlx creates its table under the lock too; before the first migration there is none.
    conn.ensure_migrations_table().await.map_err(classify)?;
    let before = applied_versions(conn).await?;
    MIGRATOR.run_direct(&mut *conn).await.map_err(classify)?;
    let after = applied_versions(conn).await?;
    conn.unlock().await.map_err(classify)?;
    let now = after
        .iter()
        .filter(|v| !before.contains(v))
        .map(|&v| known(v))
        .collect();
    Ok(Applied {
        now,
        total: after.len(),
        latest: after.iter().max().map(|&v| known(v)),
    })
}

/// The versions the database records as applied, read on a connection of its own (after a
/// run was cancelled); none when the migration table does not exist yet.
pub async fn applied(conn: &mut PgConnection) -> Result<Vec<i64>, SchemaError> {
    let exists =
        sqlx::query_scalar!(r#"SELECT to_regclass('_sqlx_migrations') IS NOT NULL AS "exists!""#)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| SchemaError::Database(database_message(&e)))?;
    if !exists {
        return Ok(Vec::new());
    }
    applied_versions(conn).await
}

async fn applied_versions(conn: &mut PgConnection) -> Result<Vec<i64>, SchemaError> {
    let mut versions: Vec<i64> = conn
        .list_applied_migrations()
        .await
        .map_err(classify)?
        .into_iter()
        .map(|m| m.version)
        .collect();
    versions.sort_unstable();
    Ok(versions)
}

/// The server process serving `conn`, for [`cancel`].
pub async fn backend_pid(conn: &mut PgConnection) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT pg_backend_pid() AS "pid!""#)
        .fetch_one(conn)
        .await
}

/// Cancels what the server process `pid` is running, from another connection: a migration
/// abandoned at the deadline is rolled back now, its locks released, rather than when the
/// server next notices that its client is gone.
pub async fn cancel(conn: &mut PgConnection, pid: i32) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT pg_cancel_backend($1) AS "cancelled!""#, pid)
        .fetch_one(conn)
        .await
}

/// Whether the server process `pid` is still there (after [`cancel`]: still rolling back).
pub async fn is_running(conn: &mut PgConnection, pid: i32) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1) AS "running!""#,
        pid
    )
    .fetch_one(conn)
    .await
}

/// The first migration of this release that `applied` lacks: where a run resumes.
pub fn next(applied: &[i64]) -> Option<&'static Migration> {
    MIGRATOR
        .iter()
        .find(|m| !m.migration_type.is_down_migration() && !applied.contains(&m.version))
}

/// A version as this release describes it (a version it does not have keeps its number).
pub fn known(version: i64) -> Version {
    Version {
        version,
        description: MIGRATOR
            .iter()
            .find(|m| m.version == version)
            .map(|m| m.description.to_string())
            .unwrap_or_else(|| "not in this release".to_owned()),
    }
}

fn classify(error: MigrateError) -> SchemaError {
    match error {
        MigrateError::ExecuteMigration(error, version) => {
            let migration = known(version);
            let database = database_message(&error);
            if MIGRATOR.iter().any(|m| m.version == version && m.no_tx) {
                SchemaError::FailedOutsideTransaction {
                    migration,
                    database,
                }
            } else {
                SchemaError::Failed {
                    migration,
                    database,
                }
            }
        }
        MigrateError::VersionMismatch(version) => SchemaError::Modified(known(version)),
        MigrateError::VersionMissing(version) => SchemaError::Unknown(version),
        MigrateError::Dirty(version) => SchemaError::Dirty(version),
        MigrateError::Execute(error) => SchemaError::Database(database_message(&error)),
        other => SchemaError::Database(other.to_string()),
    }
}

/// Postgres' message and SQLSTATE (`relation "x" already exists (SQLSTATE 42P07)`); any
/// other error as sqlx words it (an I/O or protocol error holds no credential).
pub fn database_message(error: &sqlx::Error) -> String {
    match error.as_database_error() {
        Some(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_owned(),
        },
        None => error.to_string(),
    }
}
