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

/// Writes, for each account [`due`], the credits effects due by `now` that are not written yet
/// (low levels from the catalog's entry of the account's plan). Returns the ids written, for
/// the rescue to enqueue (they are written unenqueued).
#[tracing::instrument(skip_all)]
pub async fn tick(
    pool: &PgPool,
    catalog: &Catalog,
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<String>> {
    let mut conn = pool.acquire().await.context("credits tick: a connection")?;
    let due = due(&mut conn, now)
        .await
        .context("credits tick: the accounts due")?;
    let mut written = Vec::new();
    for (source, customer) in due {
        let Ok(customer) = CustomerId::parse(&customer) else {
            continue;
        };
        let Some((held, _)) = registers::of_account(&mut conn, &source, &customer)
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
        // The debits' derived allocations counted, as every writer counts them.
        let told = credits::told(
            (&source, customer.as_str()),
            &held.spends.counted(&held.credits),
            &low,
            now.timestamp(),
        );
        written.extend(
            write(&mut conn, (&source, customer.as_str()), &told)
                .await
                .context("credits tick: writing an account's effects")?,
        );
    }
    Ok(written)
}

/// The accounts (source, customer) with a grant whose effective, expiry or void time passed in
/// the [`LOOK_BACK_DAYS`] before `now` and whose effect of it is not written yet, at most
/// [`ACCOUNTS_PER_TICK`]: an account told drops out, so the others get their turn. A crossing
/// that time makes happens at one of those times, and is written with its fact.
pub async fn due(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let since = now - chrono::Duration::days(LOOK_BACK_DAYS);
    // The effect's id as `domain::effect::effect_id` makes it: `eff_` and 32 hex digits of
    // SHA-256 over the kind, a newline and the cause (`billing::credits::told`'s causes).
    let rows = sqlx::query!(
        r#"SELECT DISTINCT g.source AS "source!", g.customer_id AS "customer_id!"
           FROM credit_grants g
           WHERE (g.expires_at > $1 AND g.expires_at <= $2
                  AND (g.voided_at IS NULL OR g.voided_at > g.expires_at)
                  AND NOT EXISTS (SELECT 1 FROM effects f WHERE f.id = 'eff_' || left(encode(sha256(
                      convert_to('billing.credits_expired' || E'
' || 'credit grant ' || g.source
                                 || '/' || g.grant_id || ' expired', 'UTF8')), 'hex'), 32)))
              OR (g.voided_at > $1 AND g.voided_at <= $2
                  AND NOT EXISTS (SELECT 1 FROM effects f WHERE f.id = 'eff_' || left(encode(sha256(
                      convert_to('billing.credits_voided' || E'
' || 'credit grant ' || g.source
                                 || '/' || g.grant_id || ' voided', 'UTF8')), 'hex'), 32)))
              OR (COALESCE(g.effective_at, g.created_at) > $1
                  AND COALESCE(g.effective_at, g.created_at) <= $2
                  AND NOT EXISTS (SELECT 1 FROM effects f WHERE f.id = 'eff_' || left(encode(sha256(
                      convert_to('billing.credits_granted' || E'
' || 'credit grant ' || g.source
                                 || '/' || g.grant_id || ' granted', 'UTF8')), 'hex'), 32)))
           LIMIT $3"#,
        since,
        now,
        ACCOUNTS_PER_TICK,
    )
    .fetch_all(exec(conn))
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.source, r.customer_id))
        .collect())
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
