//! The life every audit difference shares, written once (docs/design.md §4.13a, §4.14): a
//! difference between what we hold and what the provider counts is recorded when first seen
//! (the audit alerts then, once), seen again while it lasts (both sides and `last_seen_at`
//! brought up to date), and resolved when the two sides agree again. The meter audit
//! (`meter_audit_differences`) and the credits audit (`credit_audit_differences`) each keep
//! their differences in a table of their own and give its two statements ([`Differences`]);
//! [`settle`] runs them.

use std::future::Future;

use sqlx::PgPool;

/// The account a comparison is of: every difference is one account's.
#[derive(Debug, Clone, Copy)]
pub struct Account<'a> {
    pub source: &'a str,
    pub customer_id: &'a str,
}

/// A table of audit differences, one open row per key of an account (a grant; a meter's
/// month), its statements each the table's own and static.
pub trait Differences {
    /// A difference as one comparison sees it: its key and both sides.
    type Seen: Sync;
    /// What names a difference within its account.
    type Key: Sync;

    /// Inserts `seen` as a new open difference, or updates the open one of its key (both
    /// sides, `last_seen_at`): whether it is new.
    fn record(
        pool: &PgPool,
        account: Account<'_>,
        seen: &Self::Seen,
    ) -> impl Future<Output = anyhow::Result<bool>> + Send;

    /// Resolves the open differences of these keys (`resolved_at`, `last_seen_at`): how many
    /// there were.
    fn resolve(
        pool: &PgPool,
        account: Account<'_>,
        agreeing: &[Self::Key],
    ) -> impl Future<Output = anyhow::Result<u64>> + Send;
}

/// What one comparison left in the table.
#[derive(Debug)]
pub struct Settled<'s, S> {
    /// The differences seen for the first time: the audit alerts on each, once.
    pub new: Vec<&'s S>,
    /// Open differences whose sides agree now.
    pub resolved: u64,
}

/// Settles one comparison of `account`: each of `differing` recorded (new, or seen again for
/// as long as it lasts), each of `agreeing` resolved if it was open.
pub async fn settle<'s, D: Differences>(
    pool: &PgPool,
    account: Account<'_>,
    differing: &'s [D::Seen],
    agreeing: &[D::Key],
) -> anyhow::Result<Settled<'s, D::Seen>> {
    let mut new = Vec::new();
    for seen in differing {
        if D::record(pool, account, seen).await? {
            new.push(seen);
        }
    }
    let resolved = match agreeing {
        [] => 0,
        keys => D::resolve(pool, account, keys).await?,
    };
    Ok(Settled { new, resolved })
}
