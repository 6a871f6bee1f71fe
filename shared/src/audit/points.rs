//! The audit's checked points (docs/design.md §4.11): the fold of an account's events up to a
//! provider time, kept when an audit found the account clean, so that the next audit folds
//! only the events after it. Migration `20261212100002_audit_points.sql` keeps a point true: a
//! change to an event it covers drops its state, and every change to the account's events
//! moves the row, over which alone a point is written.

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection};

use crate::billing::fold::FoldState;
use crate::domain::{Catalog, CustomerId, SourceKind};
use crate::platform::db::exec;

/// The fold's own version: a release that changes what the fold gives of the same events
/// moves it, and the points folded before are not resumed.
const FOLD_VERSION: &str = "1";

/// A point to resume the fold from.
#[derive(Debug, Clone)]
pub(super) struct Resume {
    /// Every event of the account at or before it is folded in `state`.
    pub cut: DateTime<Utc>,
    pub state: FoldState,
    /// The events folded in `state` the account does not own.
    pub foreign_ids: Vec<i64>,
    pub events: i64,
}

/// An account's point row as the audit's snapshot read it.
pub(super) struct Point {
    /// What a point is written over (moved by any change to the account's events).
    pub moves: i64,
    /// The state to resume from, when the row holds one folded as this audit folds.
    pub resume: Option<Resume>,
}

/// What a state is folded under: the fold's version, the source's kind and mode, the catalog.
pub(super) fn fingerprint(kind: SourceKind, livemode: Option<bool>, catalog: &Catalog) -> String {
    format!(
        "{FOLD_VERSION}/{}/{kind:?}/{livemode:?}/{}",
        env!("CARGO_PKG_VERSION"),
        catalog.fingerprint()
    )
}

/// Makes sure the account has its point row before the audit's snapshot opens, so that every
/// event finished after the snapshot moves a row the snapshot saw.
pub(super) async fn claim(
    conn: &mut PgConnection,
    source: &str,
    customer: &CustomerId,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        INSERT INTO audit_points (source, customer_id) VALUES ($1, $2)
        ON CONFLICT (source, customer_id) DO NOTHING
        "#,
        source,
        customer.as_str(),
    )
    .execute(exec(conn))
    .await?;
    Ok(())
}

/// The account's point row, in the audit's snapshot; a state folded under another
/// fingerprint (or one this release cannot read) is not resumed.
pub(super) async fn read(
    conn: &mut PgConnection,
    (source, customer): (&str, &CustomerId),
    fingerprint: &str,
) -> Result<Option<Point>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        SELECT moves, cut, state, foreign_ids, fingerprint, events
        FROM audit_points WHERE source = $1 AND customer_id = $2
        "#,
        source,
        customer.as_str(),
    )
    .fetch_optional(exec(conn))
    .await?;
    Ok(row.map(|r| {
        let state = r
            .state
            .filter(|_| r.fingerprint.as_deref() == Some(fingerprint))
            .and_then(|s| serde_json::from_value::<FoldState>(s).ok());
        Point {
            moves: r.moves,
            resume: r.cut.zip(state).map(|(cut, state)| Resume {
                cut,
                state,
                foreign_ids: r.foreign_ids,
                events: r.events,
            }),
        }
    }))
}

/// Keeps `point` as the account's, unless one of its events changed since the snapshot that
/// read `moves` (the row moved): then the next audit folds again. Whether it was kept. A point
/// is derived from the events and nothing else, so its write does not wait for the disk: one
/// lost in a crash leaves the point before it, and the next audit folds from there.
pub(super) async fn keep(
    conn: &mut PgConnection,
    (source, customer): (&str, &CustomerId),
    moves: i64,
    point: &Resume,
    fingerprint: &str,
) -> anyhow::Result<bool> {
    let state = serde_json::to_value(&point.state)?;
    let mut tx = conn
        .begin_with("BEGIN; SET LOCAL synchronous_commit = off")
        .await?;
    let kept = sqlx::query!(
        r#"
        UPDATE audit_points
        SET cut = $4, state = $5, foreign_ids = $6, fingerprint = $7, events = $8,
            checked_at = inbox_now()
        WHERE source = $1 AND customer_id = $2 AND moves = $3
        "#,
        source,
        customer.as_str(),
        moves,
        point.cut,
        state,
        &point.foreign_ids,
        fingerprint,
        point.events,
    )
    .execute(exec(&mut *tx))
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(kept == 1)
}

/// An account's checked point: the provider time it covers up to, and the fold's state there.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedPoint {
    pub cut: DateTime<Utc>,
    pub state: FoldState,
    /// How many events the state folds.
    pub events: i64,
}

/// The account's checked point, when it has one (`inboxctl`'s and the tests' view of it).
pub async fn checked_point(
    conn: &mut PgConnection,
    (source, customer): (&str, &CustomerId),
) -> Result<Option<CheckedPoint>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        SELECT cut AS "cut!", state AS "state!", events FROM audit_points
        WHERE source = $1 AND customer_id = $2 AND cut IS NOT NULL AND state IS NOT NULL
        "#,
        source,
        customer.as_str(),
    )
    .fetch_optional(exec(conn))
    .await?;
    Ok(row.and_then(|r| {
        let state = serde_json::from_value(r.state).ok()?;
        Some(CheckedPoint {
            cut: r.cut,
            state,
            events: r.events,
        })
    }))
}
