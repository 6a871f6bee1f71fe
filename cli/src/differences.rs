//! `inboxctl differences`: the provider audits' open differences (docs/design.md §4.13a,
//! §4.14) — each account's meter month whose provider total differs from the reports sent,
//! and each Stripe-mirrored credit grant whose ledger balance differs from Stripe's — as the
//! scheduler's audits left them, oldest first. `meters audit` compares the meters again now.

use anyhow::Context;
use sqlx::PgPool;

use shared::operate::lists::{self, ProviderDifferences};

use crate::show::{print_json, table, when};

pub async fn run(pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let found = lists::provider_differences(&mut conn)
        .await
        .context("reading the audits' open differences")?;
    if json_output {
        return print_json(&found);
    }
    out!("{}", text(&found));
    Ok(())
}

/// Both kinds in one table: what differs, ours and the provider's, and when it was first and
/// last seen.
fn text(found: &ProviderDifferences) -> String {
    let (meters, credits) = (&found.meter_differences, &found.credit_differences);
    if meters.is_empty() && credits.is_empty() {
        return "no open difference: the meter and credits audits found every total and balance \
                as the provider counts it"
            .to_owned();
    }
    let mut t = table(&["audit", "account", "what", "ours", "provider's", "seen"]);
    for d in meters {
        t.add_row(vec![
            "meter".to_owned(),
            format!("{}/{}", d.source, d.customer_id),
            format!("{}\n{}", d.meter, d.period),
            d.ours.to_string(),
            d.theirs.to_string(),
            format!("{}\n{}", when(&d.first_seen_at), when(&d.last_seen_at)),
        ]);
    }
    for d in credits {
        t.add_row(vec![
            "credits".to_owned(),
            format!("{}/{}", d.source, d.customer_id),
            format!("{}\n{}", d.grant_id, d.unit),
            d.ours.clone().unwrap_or_else(|| "not mirrored".to_owned()),
            d.theirs.clone().unwrap_or_else(|| "not listed".to_owned()),
            format!("{}\n{}", when(&d.first_seen_at), when(&d.last_seen_at)),
        ]);
    }
    format!(
        "{} meter and {} credits difference(s) open\n{t}",
        meters.len(),
        credits.len()
    )
}
