//! The months events are stored by (docs/design.md §3.14): `inbox_events` and `deliveries` are
//! partitioned by the event's provider month, and each scheduler run makes sure this month's
//! and the next [`AHEAD`] months' partitions exist, so that an event finds its month's
//! partition already there. The purge drops them (`purge::drop_months`).

use anyhow::Context;
use sqlx::PgPool;

use crate::platform::db::exec;

/// Months made ahead of this one: two scheduler runs that fail for a month leave the next
/// month's partition still there.
pub const AHEAD: i32 = 2;

/// Makes sure this month's and the next [`AHEAD`] months' partitions exist; returns how many
/// events it moved into a month it made. Those sat in the kept partition because their
/// month had no partition of its own: the scheduler did not run for two months (or an event
/// came from further ahead than that). Nothing is ever refused for a missing month.
pub async fn make_ahead(pool: &PgPool) -> anyhow::Result<i64> {
    sqlx::query_scalar!(
        r#"SELECT inbox_make_months(inbox_month(inbox_now()), $1 + 1) AS "moved!""#,
        AHEAD,
    )
    .fetch_one(exec(pool))
    .await
    .context("making the months ahead")
}
