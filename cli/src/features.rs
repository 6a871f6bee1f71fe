//! `inboxctl features <customer>`: what the customer may use, each feature with its value,
//! where it comes from (the catalog through the plan, or a provider's entitlement) and the
//! event behind it (docs/design.md §4.12) — the account's snapshot, the one read the API's
//! feature check answers from.

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use sqlx::PgPool;

use shared::billing::account;
use shared::domain::Period;
use shared::platform::config::Env;

use crate::show::{features_table, print_json, resolve_source};

#[derive(Args)]
pub struct FeaturesArgs {
    customer_id: String,
    /// The source the customer belongs to (needed when several have that id).
    #[arg(long)]
    source: Option<String>,
    /// The Stripe connected account (acct_…) the customer belongs to, for events that came
    /// through a Connect endpoint.
    #[arg(long)]
    stripe_account: Option<String>,
}

pub async fn run(args: &FeaturesArgs, pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let catalog = Env::process().plans_or_empty()?;
    let customer =
        crate::usage::stored_customer(&args.customer_id, args.stripe_account.as_deref())?;
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let source = resolve_source(&mut conn, &customer, args.source.as_deref())
        .await?
        .with_context(|| format!("no account for customer '{customer}'"))?;
    // Features hold for the account as it stands; the period only names the allowance.
    let snapshot = account::snapshot(&mut conn, &source, &customer, &Period::current(), &catalog)
        .await?
        .with_context(|| format!("no account for customer '{customer}' in source '{source}'"))?;
    if json_output {
        return print_json(&body(&snapshot));
    }
    out!(
        "customer  {} ({}), plan {}{}",
        snapshot.customer_id,
        snapshot.source,
        snapshot.plan,
        if snapshot.deleted {
            " (customer deleted)"
        } else {
            ""
        }
    );
    match features_table(
        &snapshot.features,
        &snapshot.feature_origins,
        &snapshot.plan,
    ) {
        Some(t) => out!("{t}"),
        None if snapshot.deleted => out!("no features: a deleted customer has none"),
        None => out!(
            "no features: the catalog gives plan '{}' none (INBOX_PLANS), and no provider \
             entitlement of the customer's is active",
            snapshot.plan
        ),
    }
    Ok(())
}

/// `{"source", "customer_id", "plan", "deleted", "features": [...]}`, each feature as the
/// API's feature check answers it.
fn body(snapshot: &account::AccountSnapshot) -> Value {
    let features: Vec<Value> = snapshot
        .features
        .keys()
        .map(|key| shared::handlers::api::feature_body(key, snapshot))
        .collect();
    json!({
        "source": snapshot.source,
        "customer_id": snapshot.customer_id,
        "plan": snapshot.plan,
        "deleted": snapshot.deleted,
        "features": features,
    })
}
