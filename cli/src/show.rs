//! Read-only commands: account, events, event, stats.

use anyhow::Context;
use chrono::Utc;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use sqlx::PgPool;

use inbox::billing::Catalog;

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY).set_header(header.to_vec());
    t
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(ToString::to_string)
        .unwrap_or_else(|| "-".into())
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    out!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// `YYYY-MM`, checked.
fn parse_period(raw: Option<&str>) -> anyhow::Result<String> {
    match raw {
        None => Ok(Utc::now().format("%Y-%m").to_string()),
        Some(p) => {
            let ok = p.len() == 7
                && p.as_bytes()[4] == b'-'
                && p[..4].chars().all(|c| c.is_ascii_digit())
                && matches!(p[5..].parse::<u32>(), Ok(1..=12));
            anyhow::ensure!(ok, "--period must be YYYY-MM, got '{p}'");
            Ok(p.to_owned())
        }
    }
}

fn catalog() -> anyhow::Result<Catalog> {
    match std::env::var("INBOX_PLANS") {
        Ok(raw) if !raw.trim().is_empty() => {
            Catalog::parse(&raw).map_err(|e| anyhow::anyhow!("INBOX_PLANS: {e}"))
        }
        _ => Ok(Catalog::default()),
    }
}

pub async fn account(
    pool: &PgPool,
    customer: &str,
    source: Option<&str>,
    period: Option<&str>,
    json_output: bool,
) -> anyhow::Result<()> {
    let period = parse_period(period)?;
    let catalog = catalog()?;
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let source = match source {
        Some(s) => s.to_owned(),
        None => {
            let sources = inbox::ops::account_sources(&mut conn, customer).await?;
            match sources.as_slice() {
                [] => anyhow::bail!("no account for customer '{customer}'"),
                [one] => one.clone(),
                many => anyhow::bail!(
                    "customer '{customer}' has accounts in several sources ({}); pass --source",
                    many.join(", ")
                ),
            }
        }
    };
    let view = inbox::account::load(&mut conn, &source, customer, &period, &catalog)
        .await?
        .with_context(|| format!("no account for customer '{customer}' in source '{source}'"))?;
    if json_output {
        return print_json(&view);
    }
    out!("customer  {} ({})", view.customer_id, view.source);
    out!(
        "plan      {}{}",
        view.plan,
        if view.deleted {
            " (customer deleted)"
        } else {
            ""
        }
    );
    if let Some(plan) = &view.customer_plan {
        out!(
            "          plan register: {plan}{}",
            if view.past_due {
                ", payments past due"
            } else {
                ""
            }
        );
    }
    out!("balance   {} for {}", view.balance, view.period);
    if !view.subscriptions.is_empty() {
        let mut t = table(&["subscription", "status", "plan"]);
        for s in &view.subscriptions {
            t.add_row(vec![s.id.clone(), s.status.clone(), opt(&s.plan)]);
        }
        out!("{t}");
    }
    if !view.payments.is_empty() {
        let mut t = table(&["payment", "status"]);
        for p in &view.payments {
            t.add_row(vec![p.id.clone(), p.status.clone()]);
        }
        out!("{t}");
    }
    let mut t = table(&["provider time", "event", "type", "outcome", "reason"]);
    for line in &view.log {
        t.add_row(vec![
            line.occurred_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
            line.event_id.to_string(),
            line.event_type.clone(),
            line.outcome.clone(),
            line.reason.clone(),
        ]);
    }
    out!("event log, in provider order:\n{t}");
    Ok(())
}

pub async fn events(
    pool: &PgPool,
    status: Option<&str>,
    source: Option<&str>,
    limit: i64,
    json_output: bool,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=10_000).contains(&limit),
        "--limit must be between 1 and 10000"
    );
    if let Some(s) = status {
        anyhow::ensure!(
            inbox::store::EventStatus::parse(s).is_some(),
            "unknown status '{s}' (received, processing, applied, ignored, failed, dead, unprocessable)"
        );
    }
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let events = inbox::ops::list_events(&mut conn, status, source, limit).await?;
    if json_output {
        return print_json(&events);
    }
    let mut t = table(&[
        "id",
        "source",
        "type",
        "customer",
        "status",
        "seen",
        "tries",
        "provider time",
        "reason",
    ]);
    for e in &events {
        t.add_row(vec![
            e.id.to_string(),
            e.source.clone(),
            e.event_type.clone(),
            opt(&e.customer_id),
            e.status.clone(),
            e.seen_count.to_string(),
            e.attempts.to_string(),
            e.occurred_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
            e.reason
                .clone()
                .or_else(|| e.last_error.clone())
                .unwrap_or_default(),
        ]);
    }
    out!("{t}");
    Ok(())
}

pub async fn event(pool: &PgPool, id: i64, json_output: bool) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let detail = inbox::ops::event_detail(&mut conn, id)
        .await?
        .with_context(|| format!("no event {id}"))?;
    if json_output {
        return print_json(&detail);
    }
    let s = &detail.summary;
    out!("event {} ({} / {})", s.id, s.source, s.dedupe_key);
    out!("type        {}", s.event_type);
    out!("customer    {}", opt(&s.customer_id));
    out!("status      {} after {} attempt(s)", s.status, s.attempts);
    out!("reason      {}", opt(&s.reason));
    out!("last error  {}", opt(&s.last_error));
    out!(
        "provider    {}",
        s.occurred_at.map(|t| t.to_rfc3339()).unwrap_or_default()
    );
    out!(
        "received    {} (seen {} time(s))",
        s.received_at.to_rfc3339(),
        s.seen_count
    );
    out!(
        "enqueued    {}",
        detail
            .enqueued_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_default()
    );
    out!(
        "next try    {}",
        detail
            .next_attempt_at
            .map(|t| t.to_rfc3339())
            .unwrap_or_default()
    );
    let mut t = table(&[
        "delivery",
        "received",
        "verdict",
        "provider delivery id",
        "signed at",
    ]);
    for d in &detail.deliveries {
        t.add_row(vec![
            d.id.to_string(),
            d.received_at.to_rfc3339(),
            d.verdict.clone(),
            opt(&d.delivery_id),
            d.sent_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
        ]);
    }
    out!("{t}");
    Ok(())
}

pub async fn stats(pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let stats = inbox::ops::stats(&mut conn).await?;
    if json_output {
        return print_json(&stats);
    }
    let mut t = table(&["status", "events"]);
    for (status, count) in &stats.by_status {
        t.add_row(vec![status.clone(), count.to_string()]);
    }
    out!("{t}");
    let secs = |v: Option<f64>| v.map(|s| format!("{s:.1} s")).unwrap_or_else(|| "-".into());
    out!(
        "events {}, deliveries {}, copies per event {:.2}",
        stats.events,
        stats.deliveries,
        stats.copies_per_event
    );
    out!("oldest unapplied {:.0} s", stats.oldest_unapplied_age_secs);
    out!(
        "delivery lag p50 {}, p99 {}",
        secs(stats.delivery_lag_p50_secs),
        secs(stats.delivery_lag_p99_secs)
    );
    Ok(())
}
