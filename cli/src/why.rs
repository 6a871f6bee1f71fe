//! `inboxctl why` and `inboxctl audit`: an account's fields as the fold of its kept events
//! gives them, each with the event that decided it and those it beat, and the registers
//! compared with that fold (docs/design.md §4.11), through `shared::audit`.

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{ArgGroup, Args};
use serde_json::{json, Value};
use sqlx::PgPool;

use shared::audit::{self, Cut, Divergence, Sources, Why, WhyField};
use shared::platform::config::{parse_sources, Env};

use crate::show::{print_json, resolve_source, table};

/// Which sources the fold knows: their names, kinds and Stripe modes.
#[derive(Args)]
pub struct SourcesArg {
    /// The sources as the functions read them (only names, kinds and `livemode` are used).
    #[arg(long, env = "INBOX_SOURCES", hide_env_values = true)]
    sources: Option<String>,
}

impl SourcesArg {
    fn read(&self) -> anyhow::Result<Sources> {
        let raw = self.sources.as_deref().context(
            "INBOX_SOURCES is not set (or pass --sources): the fold needs each source's kind and Stripe mode",
        )?;
        let sources = parse_sources(raw)?;
        shared::providers::check_sources(&sources)?;
        Ok(audit::sources_of(&sources))
    }
}

#[derive(Args)]
pub struct WhyArgs {
    customer_id: String,
    /// The source the customer belongs to (needed when several have that id).
    #[arg(long)]
    source: Option<String>,
    /// The Stripe connected account (acct_…) the customer belongs to.
    #[arg(long)]
    stripe_account: Option<String>,
    /// Fold only the events the provider created up to this time (RFC 3339).
    #[arg(long, value_parser = rfc3339, value_name = "T")]
    at: Option<DateTime<Utc>>,
    /// Fold only the events the store had received before this time (RFC 3339).
    #[arg(long, value_parser = rfc3339, value_name = "T")]
    received_before: Option<DateTime<Utc>>,
    #[command(flatten)]
    sources: SourcesArg,
}

#[derive(Args)]
#[command(group(ArgGroup::new("accounts").required(true).args(["all", "customer"])))]
pub struct AuditArgs {
    /// Every account (of every configured source, or of --source).
    #[arg(long)]
    all: bool,
    /// Only this customer's accounts (as stored: a Connect customer is acct_…/cus_…).
    #[arg(long)]
    customer: Option<String>,
    /// Only this source's accounts.
    #[arg(long)]
    source: Option<String>,
    /// At most N accounts, in key order.
    #[arg(long, value_name = "N")]
    limit: Option<i64>,
    #[command(flatten)]
    sources: SourcesArg,
}

/// Registers differ from the fold: `audit` exits 1 after printing them.
#[derive(Debug, thiserror::Error)]
#[error("{0} field(s) differ from the fold of their account's events")]
pub struct Diverged(pub usize);

fn rfc3339(raw: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("'{raw}' is not an RFC 3339 time ({e})"))
}

/// The source named, checked against the configured ones.
fn configured<'a>(sources: &Sources, name: &'a str) -> anyhow::Result<&'a str> {
    if sources.contains_key(name) {
        return Ok(name);
    }
    let mut names: Vec<&str> = sources.keys().map(String::as_str).collect();
    names.sort_unstable();
    anyhow::bail!(
        "no source '{name}' in INBOX_SOURCES (configured: {})",
        names.join(", ")
    )
}

pub async fn why(args: &WhyArgs, pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let sources = args.sources.read()?;
    let catalog = Env::process().plans_or_empty()?;
    let customer =
        crate::usage::stored_customer(&args.customer_id, args.stripe_account.as_deref())?;
    if let Some(source) = &args.source {
        configured(&sources, source)?;
    }
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let source = resolve_source(&mut conn, &customer, args.source.as_deref())
        .await?
        .with_context(|| format!("no account for customer '{customer}'"))?;
    configured(&sources, &source)?;
    let cut = Cut {
        at: args.at,
        received_before: args.received_before,
    };
    let why = audit::why(&mut conn, &sources, &catalog, (&source, &customer), cut)
        .await?
        .with_context(|| format!("no account for customer '{customer}' in source '{source}'"))?;
    if json_output {
        return print_json(&why);
    }
    print_why(&why);
    Ok(())
}

fn time(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// A field's value as a person reads it: strings bare, the rest as JSON.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

/// The subscription a field is of (`subscription:<id>:<name>`).
fn subscription_of(field: &str) -> Option<&str> {
    field
        .strip_prefix("subscription:")?
        .rsplit_once(':')
        .map(|(id, _)| id)
}

/// The rows of `why`'s table: a subscription's fields decided by one event and beating the
/// same ones are one row (its status first), so that what they beat is said once; any other
/// field is a row of its own, and so is a field whose register differs from the fold.
fn rows(fields: &[WhyField]) -> Vec<Vec<&WhyField>> {
    let mut rows: Vec<Vec<&WhyField>> = Vec::new();
    for f in fields {
        if let Some(row) = rows.last_mut() {
            let head = row[0];
            let same_subscription = subscription_of(&head.field)
                .is_some_and(|id| subscription_of(&f.field) == Some(id));
            let agreeing = head.stored.is_none() && f.stored.is_none();
            if same_subscription
                && agreeing
                && head.decided_by == f.decided_by
                && head.beaten == f.beaten
            {
                row.push(f);
                continue;
            }
        }
        rows.push(vec![f]);
    }
    const ORDER: [&str; 7] = [
        "status",
        "plan",
        "current_period_end",
        "cancel_at_period_end",
        "cancel_at",
        "trial_end",
        "ended_at",
    ];
    for row in &mut rows {
        row.sort_by_key(|f| {
            let name = f.field.rsplit(':').next().unwrap_or_default();
            ORDER.iter().position(|o| *o == name).unwrap_or(ORDER.len())
        });
    }
    rows
}

fn print_why(why: &Why) {
    out!("customer  {} ({})", why.customer_id, why.source);
    if let Some(at) = &why.at {
        out!(
            "at        {} (events the provider created by then)",
            time(at)
        );
    }
    if let Some(t) = &why.received_before {
        out!("received  before {} (what the store knew then)", time(t));
    }
    let mut t = table(&["field", "value", "decided by; what it beat"]);
    for row in rows(&why.fields) {
        let f = row[0];
        // A register that is not what its events give is the thing to look at.
        let (field, value) = match (row.as_slice(), &f.stored) {
            ([_], Some(stored)) => (
                format!("! {}", f.field),
                format!("{}\nstored: {}", shown(&f.value), shown(stored)),
            ),
            ([_], None) => (f.field.clone(), shown(&f.value)),
            // A subscription's fields, a line each: its id, then each field's value.
            (many, _) => {
                let mut names = vec!["subscription".to_owned()];
                let mut values = vec![subscription_of(&f.field).unwrap_or_default().to_owned()];
                for f in many {
                    names.push(format!(
                        "  {}",
                        f.field.rsplit(':').next().unwrap_or_default()
                    ));
                    values.push(shown(&f.value));
                }
                (names.join("\n"), values.join("\n"))
            }
        };
        let mut said = match &f.decided_by {
            Some(e) => vec![format!(
                "#{} {}, {} via {}{}",
                e.event_id,
                e.event_type,
                time(&e.occurred_at),
                json!(e.via).as_str().unwrap_or_default(),
                if e.replayed { ", replayed" } else { "" }
            )],
            None => vec!["-".to_owned()],
        };
        for b in &f.beaten {
            said.push(format!("beat #{} {}: {}", b.event_id, b.reason, b.detail));
        }
        t.add_row(vec![field, value, said.join("\n")]);
    }
    out!("{t}");
    match (why.purged, &why.complete_from) {
        (0, _) => out!("purged    none: every event is kept"),
        (n, Some(from)) => out!(
            "purged    {n} event(s): the answer is whole for times at or after {}",
            time(from)
        ),
        (n, None) => out!("purged    {n} event(s)"),
    }
    match why.pending.as_slice() {
        [] => out!("pending   none"),
        ids => out!("pending   {ids:?} (not finished: the registers do not show them yet)"),
    }
    match why.divergent.as_slice() {
        [] if why.at.is_some() || why.received_before.is_some() => {
            out!("divergent not compared (a cut in the past)")
        }
        [] => out!("divergent none: the registers are what the events give"),
        fields => out!(
            "divergent {} (marked !: the register differs from the fold)",
            fields.join(", ")
        ),
    }
}

pub async fn audit(args: &AuditArgs, pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let mut sources = args.sources.read()?;
    if let Some(source) = &args.source {
        configured(&sources, source)?;
        sources.retain(|name, _| name == source);
    }
    if let Some(limit) = args.limit.filter(|l| *l < 1) {
        anyhow::bail!("--limit must be at least 1, got {limit}");
    }
    let catalog = Env::process().plans_or_empty()?;
    let report = audit::audit_all(
        pool,
        &sources,
        &catalog,
        args.customer.as_deref(),
        args.limit,
    )
    .await?;
    if json_output {
        print_json(&json!({
            "checked": report.checked,
            "skipped": report.skipped,
            "divergent": report.divergent,
        }))?;
    } else {
        print_audit(report.checked, report.skipped, &report.divergent);
    }
    match report.divergent.len() {
        0 => Ok(()),
        n => Err(Diverged(n).into()),
    }
}

fn print_audit(checked: u64, skipped: u64, divergent: &[Divergence]) {
    out!("checked {checked} account(s), skipped {skipped} (events in flight, or too many to fold)");
    if divergent.is_empty() {
        out!("no register differs from the fold of its account's events");
        return;
    }
    let mut t = table(&["account", "field", "stored, folded"]);
    for d in divergent {
        t.add_row(vec![
            format!("{}/{}", d.source, d.customer_id),
            d.field.clone(),
            format!("stored: {}\nfolded: {}", shown(&d.stored), shown(&d.folded)),
        ]);
    }
    out!("{t}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_is_an_rfc3339_time_in_any_offset() {
        assert_eq!(
            rfc3339("2026-03-05T11:00:00+01:00").unwrap(),
            rfc3339("2026-03-05T10:00:00Z").unwrap()
        );
        assert!(rfc3339("2026-03-05").is_err());
        assert!(rfc3339("yesterday").is_err());
    }
}
