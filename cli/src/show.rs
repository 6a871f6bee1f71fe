//! Read-only commands: account, events, event, stats (and the features table `features`
//! shares with `account`).

use anyhow::Context;
use comfy_table::{presets::UTF8_BORDERS_ONLY, ContentArrangement, Table};
use sqlx::PgPool;

use shared::billing::account::FeatureOrigin;
use shared::domain::features::{FeatureValue, Features};
use shared::domain::Catalog;
use shared::domain::{CustomerId, Period};
use shared::platform::config::Env;

/// The widest a table is printed: 100 columns, or the terminal's width when it is narrower.
const TABLE_WIDTH: u16 = 100;

/// A table that fits [`TABLE_WIDTH`]: its cells wrap (at spaces where they can) to fit.
pub(crate) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY)
        .set_header(header.to_vec())
        .set_content_arrangement(ContentArrangement::Dynamic);
    let width = t.width().map_or(TABLE_WIDTH, |w| w.min(TABLE_WIDTH));
    t.set_width(width);
    t
}

/// A time in a table: to the second, in UTC (the JSON has it whole).
pub(crate) fn when(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub(crate) fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(ToString::to_string)
        .unwrap_or_else(|| "-".into())
}

pub(crate) fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    out!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// `YYYY-MM`, checked; the current UTC month by default.
pub(crate) fn parse_period(raw: Option<&str>) -> anyhow::Result<Period> {
    match raw {
        None => Ok(Period::current()),
        Some(p) => {
            Period::parse(p).map_err(|_| anyhow::anyhow!("--period must be YYYY-MM, got '{p}'"))
        }
    }
}

/// The source named, or the one source in which the customer has an account; `None` when
/// it has none, an error when it has several and none was named.
pub(crate) async fn resolve_source(
    conn: &mut sqlx::PgConnection,
    customer: &CustomerId,
    source: Option<&str>,
) -> anyhow::Result<Option<String>> {
    if let Some(source) = source {
        return Ok(Some(source.to_owned()));
    }
    let sources = shared::billing::account::account_sources(conn, customer).await?;
    match sources.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(one.clone())),
        many => anyhow::bail!(
            "customer '{customer}' has accounts in several sources ({}); pass --source",
            many.join(", ")
        ),
    }
}

fn catalog() -> anyhow::Result<Catalog> {
    Ok(Env::process().plans_or_empty()?)
}

pub async fn account(
    pool: &PgPool,
    customer_id: &CustomerId,
    source: Option<&str>,
    period: Option<&str>,
    log: Option<u32>,
    json_output: bool,
) -> anyhow::Result<()> {
    let period = parse_period(period)?;
    // A person at a terminal wants the latest lines; the JSON is whole unless asked.
    let log_lines = match log {
        Some(0) => None,
        Some(n) => Some(i64::from(n)),
        None if json_output => None,
        None => Some(ACCOUNT_LOG_LINES),
    };
    let catalog = catalog()?;
    let customer = customer_id.as_str();
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let source = resolve_source(&mut conn, customer_id, source)
        .await?
        .with_context(|| format!("no account for customer '{customer}'"))?;
    let view = shared::billing::account::load_with_log(
        &mut conn,
        &source,
        customer_id,
        &period,
        &catalog,
        log_lines,
    )
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
    match (&view.customer_plan, &view.customer_plan_key) {
        (Some(plan), _) => out!("          plan register: {plan}"),
        (None, Some(key)) => out!("          plan register: '{key}' (not in the plan catalog)"),
        (None, None) => {}
    }
    // What the registers hold that does not make the plan, as `why` says it.
    for r in &view.plan_reasons {
        out!("          not counted: {}: {}", r.reason, r.detail);
    }
    match view.standing.as_deref() {
        Some("past_due") => out!("standing  payments past due"),
        Some(_) => out!("standing  payments in good standing"),
        None => {}
    }
    out!(
        "balance   {} for {}: {} used, {} remaining",
        view.balance,
        view.period,
        view.used,
        view.remaining
    );
    if !view.subscriptions.is_empty() {
        let mut t = table(&["subscription", "status", "plan", "ends"]);
        for s in &view.subscriptions {
            // "pro until 2026-12-31, cancels at period end"
            let ends = shared::billing::SubscriptionEnds {
                current_period_end: s.current_period_end,
                cancel_at_period_end: s.cancel_at_period_end,
                cancel_at: s.cancel_at,
                trial_end: s.trial_end,
                ended_at: s.ended_at,
            };
            t.add_row(vec![
                s.id.clone(),
                s.status.clone(),
                opt(&s.plan),
                ends.words(),
            ]);
        }
        out!("{t}");
    }
    match features_table(&view.features, &view.feature_origins, &view.plan) {
        Some(t) => out!("{t}"),
        None => out!("features  none"),
    }
    if !view.payments.is_empty() {
        let mut t = table(&["payment", "status"]);
        for p in &view.payments {
            t.add_row(vec![p.id.clone(), p.status.clone()]);
        }
        out!("{t}");
    }
    let mut t = table(&["event, provider time", "outcome", "reason"]);
    for line in &view.log {
        t.add_row(vec![
            format!(
                "#{} {}\n{}",
                line.event_id,
                line.event_type,
                line.occurred_at.as_ref().map(when).unwrap_or_default()
            ),
            line.outcome.clone(),
            line.reason.clone(),
        ]);
    }
    let shown = view.log.len() as i64;
    if shown < view.log_total {
        out!(
            "event log, in provider order (the latest {shown} of {}; --log 0 shows all):\n{t}",
            view.log_total
        );
    } else {
        out!("event log, in provider order:\n{t}");
    }
    Ok(())
}

/// An account's features as a table: each key, its value, where it comes from (the catalog
/// through `plan`, or a provider's entitlement) and the event behind it; `None` when it has
/// none. `account` and `features` print the same.
pub(crate) fn features_table(
    features: &Features,
    origins: &std::collections::BTreeMap<String, FeatureOrigin>,
    plan: &str,
) -> Option<Table> {
    if features.is_empty() {
        return None;
    }
    let mut t = table(&["feature", "value", "from", "decided by, provider time"]);
    for (key, value) in features {
        let origin = origins.get(key);
        let from = match origin.map(|o| o.source) {
            Some("catalog") => format!("catalog (plan {plan})"),
            Some(source) => source.to_owned(),
            None => "-".to_owned(),
        };
        let event = origin.and_then(|o| o.decided_by.as_ref()).map_or_else(
            || "-".to_owned(),
            |e| {
                format!(
                    "#{} {}\n{}",
                    e.event_id,
                    e.event_type,
                    e.occurred_at.as_ref().map(when).unwrap_or_default()
                )
            },
        );
        let value = match value {
            FeatureValue::Flag(false) => "false (not allowed)".to_owned(),
            // A string quoted, so that "true" is not read as the flag.
            other => other.to_string(),
        };
        t.add_row(vec![key.clone(), value, from, event]);
    }
    Some(t)
}

/// The log lines `account` shows in text unless told otherwise.
const ACCOUNT_LOG_LINES: i64 = 100;

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
    let status = status.map(parse_status).transpose()?;
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let events = shared::inbox::read::list_events(&mut conn, status, source, limit).await?;
    if json_output {
        return print_json(&events);
    }
    let mut t = table(&["event, account, provider time", "status", "reason"]);
    for e in &events {
        t.add_row(vec![
            format!(
                "#{} {}\n{} {}\n{}",
                e.id,
                e.event_type,
                e.source,
                opt(&e.customer_id),
                e.occurred_at.as_ref().map(when).unwrap_or_default()
            ),
            format!("{}\nseen {}, tries {}", e.status, e.seen_count, e.attempts),
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
    let detail = shared::inbox::read::event_detail(&mut conn, id)
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
        "verdict",
        "received, signed at",
        "provider delivery id",
    ]);
    for d in &detail.deliveries {
        t.add_row(vec![
            d.id.to_string(),
            d.verdict.clone(),
            format!(
                "{}\n{}",
                when(&d.received_at),
                d.sent_at.as_ref().map(when).unwrap_or_else(|| "-".into())
            ),
            opt(&d.delivery_id),
        ]);
    }
    out!("{t}");
    Ok(())
}

pub async fn stats(pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let stats = shared::inbox::read::stats(&mut conn).await?;
    if json_output {
        return print_json(&stats);
    }
    let mut t = table(&["status", "events"]);
    for (status, count) in &stats.backlog.by_status {
        t.add_row(vec![status.clone(), count.to_string()]);
    }
    out!("{t}");
    let lag = |v: Option<f64>| v.map(human_duration).unwrap_or_else(|| "-".into());
    out!(
        "events {}, deliveries {}, copies per event {:.2}",
        stats.events,
        stats.deliveries,
        stats.copies_per_event
    );
    out!(
        "oldest unapplied {}",
        human_duration(stats.backlog.oldest_unapplied_age_secs)
    );
    out!(
        "delivery lag p50 {}, p99 {} (provider time to our first receipt; late and reconciled events lag by how late they were)",
        lag(stats.delivery_lag_p50_secs),
        lag(stats.delivery_lag_p99_secs)
    );
    Ok(())
}

/// A duration in the unit a person reads it in: `850 ms`, `42.0 s`, `7 min 5 s`,
/// `3 h 20 min`, `1,262 d 17 h`. Negative when the provider time is ahead of ours.
pub fn human_duration(secs: f64) -> String {
    if !secs.is_finite() {
        return "-".into();
    }
    if secs < 0.0 {
        return format!("-{}", human_duration(-secs));
    }
    let whole = secs.round() as u64;
    let (d, h, m, s) = (
        whole / 86_400,
        whole / 3_600 % 24,
        whole / 60 % 60,
        whole % 60,
    );
    if secs < 1.0 {
        format!("{:.0} ms", secs * 1000.0)
    } else if secs < 60.0 {
        format!("{secs:.1} s")
    } else if whole < 3_600 {
        format!("{m} min {s} s")
    } else if whole < 86_400 {
        format!("{h} h {m} min")
    } else {
        let days = d.to_string();
        let mut grouped = String::new();
        for (i, c) in days.chars().enumerate() {
            if i > 0 && (days.len() - i) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(c);
        }
        format!("{grouped} d {h} h")
    }
}

/// An event status named on the command line.
pub(crate) fn parse_status(raw: &str) -> anyhow::Result<shared::domain::EventStatus> {
    raw.parse().map_err(|_| {
        anyhow::anyhow!(
            "unknown status '{raw}' (received, processing, applied, ignored, failed, dead, unprocessable)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn durations_read_in_human_units() {
        assert_eq!(human_duration(0.25), "250 ms");
        assert_eq!(human_duration(42.04), "42.0 s");
        assert_eq!(human_duration(425.0), "7 min 5 s");
        assert_eq!(human_duration(12_000.0), "3 h 20 min");
        // The back-dated event that once printed "109097966.2 s".
        assert_eq!(human_duration(109_097_966.2), "1,262 d 16 h");
        assert_eq!(human_duration(-3.0), "-3.0 s");
    }
}
