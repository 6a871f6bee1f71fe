//! What an account's credits tell when no event comes (docs/design.md §4.14): a grant's
//! expiry, a void or an effective time is a time, not an event, so the scheduler's tick writes
//! what the credits tell as of now (`billing::credits::told`) for the accounts with such a time
//! lately passed. Each effect once by its id, whoever writes it first: the tick, an event's
//! commit or a debit's.

use anyhow::Context;
use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use crate::billing::credits;
use crate::billing::registers;
use crate::domain::effect::NewEffect;
use crate::domain::{Catalog, CustomerId, Period, ProviderTime};
use crate::platform::db::exec;

/// How far back a tick looks for a grant's time that passed: a tick missed for longer than this
/// (the scheduler stopped) leaves the account's effects to its next event or debit.
pub const LOOK_BACK_DAYS: i64 = 7;

/// Accounts a tick takes at most; the others wait for the next.
pub const ACCOUNTS_PER_TICK: i64 = 500;

/// Writes, for each account with a grant's effective, expiry or void time in the
/// [`LOOK_BACK_DAYS`] before `now`, the credits effects due by `now` that are not written yet
/// (low levels from the catalog's entry of the account's plan). Returns the ids written, for
/// the rescue to enqueue (they are written unenqueued).
#[tracing::instrument(skip_all)]
pub async fn tick(
    pool: &PgPool,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<String>> {
    let mut conn = pool.acquire().await.context("credits tick: a connection")?;
    let since = now - chrono::Duration::days(LOOK_BACK_DAYS);
    let due = sqlx::query!(
        r#"SELECT DISTINCT source AS "source!", customer_id AS "customer_id!" FROM credit_grants
           WHERE (expires_at > $1 AND expires_at <= $2)
              OR (voided_at > $1 AND voided_at <= $2)
              OR (COALESCE(effective_at, created_at) > $1 AND COALESCE(effective_at, created_at) <= $2)
           LIMIT $3"#,
        since,
        now,
        ACCOUNTS_PER_TICK,
    )
    .fetch_all(exec(&mut *conn))
    .await
    .context("credits tick: the accounts due")?;
    let mut written = Vec::new();
    for account in due {
        let Ok(customer) = CustomerId::parse(&account.customer_id) else {
            continue;
        };
        let Some((held, _)) = registers::of_account(&mut conn, &account.source, &customer)
            .await
            .context("credits tick: an account's registers")?
        else {
            continue;
        };
        let plan = held
            .state(
                customer.as_str(),
                &Period::of(ProviderTime::from(now)),
                catalog,
            )
            .plan;
        let low = credits::low_levels(&catalog.credits_low_of(&plan));
        let told = credits::told(
            (&account.source, customer.as_str()),
            &held.credits,
            &low,
            now.timestamp(),
        );
        written.extend(
            write(&mut conn, (&account.source, customer.as_str()), &told)
                .await
                .context("credits tick: writing an account's effects")?,
        );
    }
    Ok(written)
}

/// Writes the effects not written yet with the account's next sequence numbers, in one
/// statement; returns their ids. An id written meanwhile by another writer fails the statement
/// (no `ON CONFLICT`, as the worker's), and the next tick finds it written.
pub async fn write(
    conn: &mut PgConnection,
    (source, customer): (&str, &str),
    effects: &[NewEffect],
) -> Result<Vec<String>, sqlx::Error> {
    if effects.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = effects.iter().map(|e| e.id.as_str()).collect();
    let kinds: Vec<&str> = effects.iter().map(|e| e.kind.as_str()).collect();
    let causes: Vec<&str> = effects.iter().map(|e| e.cause.as_str()).collect();
    let bodies: Vec<serde_json::Value> = effects.iter().map(|e| e.body.clone()).collect();
    sqlx::query_scalar!(
        r#"
        WITH new_effects AS (
            SELECT e.id, e.kind, e.cause, e.body, row_number() OVER (ORDER BY e.n) AS k
            FROM unnest($3::text[], $4::text[], $5::text[], $6::jsonb[])
                 WITH ORDINALITY AS e (id, kind, cause, body, n)
            WHERE NOT EXISTS (SELECT 1 FROM effects f WHERE f.id = e.id)
        ), account AS (
            UPDATE accounts a SET effect_seq = a.effect_seq + (SELECT count(*) FROM new_effects)
            WHERE a.source = $1 AND a.customer_id = $2
            RETURNING a.effect_seq - (SELECT count(*) FROM new_effects) AS base
        )
        INSERT INTO effects (id, kind, cause, source, customer_id, sequence, event_id,
                             occurred_at, body)
        SELECT n.id, n.kind, n.cause, $1, $2, account.base + n.k, NULL,
               (n.body->>'occurred_at')::timestamptz,
               jsonb_set(n.body, '{data,sequence}', to_jsonb(account.base + n.k))
        FROM account, new_effects n
        ORDER BY n.k
        RETURNING id
        "#,
        source,
        customer,
        &ids as &[&str],
        &kinds as &[&str],
        &causes as &[&str],
        &bodies,
    )
    .fetch_all(exec(conn))
    .await
}
