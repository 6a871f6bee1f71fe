//! The overview (docs/design.md §12.6): per source what arrived in the last hour and what
//! waits, the effects and the audit's divergences, and first what needs a person, each with
//! the console page that shows it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use serde::Serialize;
use sqlx::PgConnection;

use crate::domain::SourceKind;
use crate::platform::db::exec;

/// 401s in an hour from one source past which a person should look (a secret rolled on one
/// side only, or someone probing the endpoint).
pub const UNAUTHORIZED_SPIKE: i64 = 10;
/// An event not applied after this long means the pipeline is stuck somewhere.
pub const BACKLOG_AGE_SECS: f64 = 300.0;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceOverview {
    pub source: String,
    pub kind: &'static str,
    /// Deliveries that passed authentication in the last hour (copies included).
    pub deliveries_last_hour: i64,
    /// Deliveries refused 401 in the last hour.
    pub unauthorized_last_hour: i64,
    /// The newest stored event's or delivery's time.
    pub last_delivery_at: Option<DateTime<Utc>>,
    /// Events not finished or finished badly, by status (`applied` and `ignored`, the bulk,
    /// are not counted: that would read the whole table).
    pub events_by_status: BTreeMap<String, i64>,
    pub oldest_unapplied_age_secs: f64,
    pub dead: i64,
    pub unprocessable: i64,
    /// Deliveries whose content differed from the stored event's under the same id.
    pub conflicting: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EffectCounts {
    pub pending: i64,
    pub dead: i64,
}

/// Something a person should look at, with the console page (relative to `/console/`) that
/// shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attention {
    pub kind: &'static str,
    pub source: Option<String>,
    pub count: i64,
    pub detail: String,
    pub link: String,
}

/// Meter reports (docs/design.md §4.13): those on their way, those given up on, and the open
/// differences between what was sent and what the provider's meter counts (§4.13a).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MeterCounts {
    pub pending: i64,
    pub dead: i64,
    pub differences_open: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overview {
    pub generated_at: DateTime<Utc>,
    pub sources: Vec<SourceOverview>,
    pub effects: EffectCounts,
    pub meter_reports: MeterCounts,
    pub divergences_open: i64,
    /// Stripe credit grants whose mirrored ledger balance differs from Stripe's (§4.14).
    pub credit_differences_open: i64,
    pub needs_attention: Vec<Attention>,
}

/// The overview of the configured `sources`; a source silent for more than
/// `silent_after_hours` since its last delivery needs a person (one that never received any
/// is configured and not used yet: no alarm).
pub async fn overview(
    conn: &mut PgConnection,
    sources: &[(String, SourceKind)],
    silent_after_hours: f64,
) -> Result<Overview, sqlx::Error> {
    let names: Vec<String> = sources.iter().map(|(name, _)| name.clone()).collect();
    // The last hour's deliveries are read from their own index, then each one's event by
    // its key: never a source's whole history (the plan is in docs/design.md §12.5).
    let per_source = sqlx::query!(
        r#"
        WITH recent AS (
            SELECT (SELECT e.source FROM inbox_events e WHERE e.id = d.event_id) AS source,
                   count(*) AS deliveries, max(d.received_at) AS last
            FROM deliveries d
            WHERE d.received_at > inbox_now() - interval '1 hour'
            GROUP BY 1
        ), conflicts AS (
            SELECT (SELECT e.source FROM inbox_events e WHERE e.id = d.event_id) AS source,
                   count(*) AS conflicting
            FROM deliveries d
            WHERE d.verdict = 'conflict'
            GROUP BY 1
        )
        SELECT s.source AS "source!", inbox_now() AS "now!",
               COALESCE(r.deliveries, 0) AS "deliveries!",
               (SELECT COALESCE(sum(f.count), 0) FROM intake_refusals f
                WHERE f.source = s.source AND f.minute > inbox_now() - interval '1 hour')::bigint
                 AS "refused!",
               GREATEST((SELECT max(e.received_at) FROM inbox_events e WHERE e.source = s.source),
                        r.last) AS last_delivery,
               (SELECT EXTRACT(EPOCH FROM inbox_now() - min(e.received_at))::float8
                FROM inbox_work w JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
                WHERE w.stage = 'pending' AND w.source = s.source)
                 AS oldest,
               COALESCE(c.conflicting, 0) AS "conflicting!"
        FROM unnest($1::text[]) WITH ORDINALITY AS s(source, n)
        LEFT JOIN recent r ON r.source = s.source
        LEFT JOIN conflicts c ON c.source = s.source
        ORDER BY s.n
        "#,
        &names,
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    let by_status = sqlx::query!(
        r#"SELECT e.source, e.status, count(*) AS "count!"
           FROM inbox_work w JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
           GROUP BY e.source, e.status"#
    )
    .fetch_all(exec(&mut *conn))
    .await?;
    let others = sqlx::query!(
        r#"SELECT (SELECT count(*) FROM effects WHERE status = 'pending') AS "pending!",
                  (SELECT count(*) FROM effects WHERE status = 'dead') AS "dead!",
                  (SELECT count(*) FROM audit_divergences) AS "divergences!",
                  (SELECT count(*) FROM meter_reports WHERE status = 'pending') AS "meter_pending!",
                  (SELECT count(*) FROM meter_reports WHERE status = 'dead') AS "meter_dead!",
                  (SELECT count(*) FROM meter_audit_differences WHERE resolved_at IS NULL)
                    AS "meter_differences!",
                  (SELECT count(*) FROM credit_audit_differences WHERE resolved_at IS NULL)
                    AS "credit_differences!""#
    )
    .fetch_one(exec(&mut *conn))
    .await?;
    let generated_at = per_source.first().map_or_else(Utc::now, |row| row.now);
    let sources: Vec<SourceOverview> = per_source
        .into_iter()
        .zip(sources)
        .map(|(row, (_, kind))| {
            let events_by_status: BTreeMap<String, i64> = by_status
                .iter()
                .filter(|s| s.source == row.source)
                .map(|s| (s.status.clone(), s.count))
                .collect();
            let count = |status: &str| events_by_status.get(status).copied().unwrap_or(0);
            SourceOverview {
                kind: kind.as_str(),
                deliveries_last_hour: row.deliveries,
                unauthorized_last_hour: row.refused,
                last_delivery_at: row.last_delivery,
                oldest_unapplied_age_secs: row.oldest.unwrap_or(0.0),
                dead: count("dead"),
                unprocessable: count("unprocessable"),
                conflicting: row.conflicting,
                events_by_status,
                source: row.source,
            }
        })
        .collect();
    let effects = EffectCounts {
        pending: others.pending,
        dead: others.dead,
    };
    let meter_reports = MeterCounts {
        pending: others.meter_pending,
        dead: others.meter_dead,
        differences_open: others.meter_differences,
    };
    let needs_attention = needs_attention(
        &sources,
        (effects, meter_reports),
        (others.divergences, others.credit_differences),
        silent_after_hours,
        generated_at,
    );
    Ok(Overview {
        generated_at,
        sources,
        effects,
        meter_reports,
        divergences_open: others.divergences,
        credit_differences_open: others.credit_differences,
        needs_attention,
    })
}

/// What needs a person, the worst first: events and effects given up on, then what the store
/// and the audit disagree on, then a source that broke or went quiet, then a backlog.
fn needs_attention(
    sources: &[SourceOverview],
    (effects, meters): (EffectCounts, MeterCounts),
    (divergences, credit_differences): (i64, i64),
    silent_after_hours: f64,
    now: DateTime<Utc>,
) -> Vec<Attention> {
    let mut all = Vec::new();
    type Count = fn(&SourceOverview) -> i64;
    let per_source = |all: &mut Vec<Attention>,
                      kind,
                      count: Count,
                      words: &str,
                      link: &dyn Fn(&str) -> String| {
        for s in sources {
            let n = count(s);
            if n > 0 {
                all.push(Attention {
                    kind,
                    source: Some(s.source.clone()),
                    count: n,
                    detail: format!("{n} {words} from {}", s.source),
                    link: link(&segment(&s.source)),
                });
            }
        }
    };
    per_source(&mut all, "dead_events", |s| s.dead, "dead event(s)", &|s| {
        format!("events?status=dead&source={s}")
    });
    per_source(
        &mut all,
        "unprocessable_events",
        |s| s.unprocessable,
        "unprocessable event(s)",
        &|s| format!("events?status=unprocessable&source={s}"),
    );
    if effects.dead > 0 {
        all.push(Attention {
            kind: "dead_effects",
            source: None,
            count: effects.dead,
            detail: format!("{} effect(s) the app never acknowledged", effects.dead),
            link: "effects?status=dead".into(),
        });
    }
    if meters.dead > 0 {
        all.push(Attention {
            kind: "dead_meter_reports",
            source: None,
            count: meters.dead,
            detail: format!(
                "{} debit(s) or correction(s) the provider's meter was never told of",
                meters.dead
            ),
            link: "meters?status=dead".into(),
        });
    }
    if meters.differences_open > 0 {
        all.push(Attention {
            kind: "meter_differences",
            source: None,
            count: meters.differences_open,
            detail: format!(
                "{} account-month(s) where the provider's meter counts otherwise than the reports sent",
                meters.differences_open
            ),
            // Listed with the other audits' findings; the Meters page lists reports.
            link: "divergences".into(),
        });
    }
    if credit_differences > 0 {
        all.push(Attention {
            kind: "credit_differences",
            source: None,
            count: credit_differences,
            detail: format!(
                "{credit_differences} Stripe credit grant(s) whose mirrored balance differs from Stripe's"
            ),
            link: "divergences".into(),
        });
    }
    // Every divergent account and field is on one page; the latest account alone would hide
    // the others.
    if divergences > 0 {
        all.push(Attention {
            kind: "divergences",
            source: None,
            count: divergences,
            detail: format!(
                "{divergences} field(s) where the store and the fold of the events differ"
            ),
            link: "divergences".into(),
        });
    }
    per_source(
        &mut all,
        "conflicting_deliveries",
        |s| s.conflicting,
        "delivery(ies) that contradict a stored event",
        &|s| format!("events?source={s}"),
    );
    for s in sources {
        if s.unauthorized_last_hour >= UNAUTHORIZED_SPIKE {
            all.push(Attention {
                kind: "unauthorized_spike",
                source: Some(s.source.clone()),
                count: s.unauthorized_last_hour,
                detail: format!(
                    "{} deliveries from {} refused 401 in the last hour (a signing secret that no longer matches?)",
                    s.unauthorized_last_hour, s.source
                ),
                link: format!("events?source={}", segment(&s.source)),
            });
        }
        if let Some(hours) = silent_hours(s, now).filter(|h| *h > silent_after_hours) {
            all.push(Attention {
                kind: "silent_source",
                source: Some(s.source.clone()),
                count: 0,
                detail: format!("nothing from {} for {hours:.1} h", s.source),
                link: format!("events?source={}", segment(&s.source)),
            });
        }
        if s.oldest_unapplied_age_secs > BACKLOG_AGE_SECS {
            let waiting: i64 = ["received", "processing", "failed"]
                .iter()
                .filter_map(|status| s.events_by_status.get(*status))
                .sum();
            all.push(Attention {
                kind: "backlog",
                source: Some(s.source.clone()),
                count: waiting,
                detail: format!(
                    "{waiting} event(s) from {} waiting, the oldest for {:.0} s",
                    s.source, s.oldest_unapplied_age_secs
                ),
                link: format!("events?status=failed&source={}", segment(&s.source)),
            });
        }
    }
    all
}

/// The hours since the source's last delivery; `None` for a source that never received one
/// (configured, not used yet: its `last_delivery_at` is null, which says so).
fn silent_hours(source: &SourceOverview, now: DateTime<Utc>) -> Option<f64> {
    let last = source.last_delivery_at?;
    Some((now - last).num_seconds() as f64 / 3600.0)
}

/// A name as one segment of a console path or query value.
fn segment(raw: &str) -> String {
    utf8_percent_encode(raw, NON_ALPHANUMERIC).to_string()
}

/// The deliveries of one hour with one outcome: `stored` (a new event), `duplicate` (a copy),
/// `conflict` (same key, other content), or `refused` (401, counted by the intake).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeliveriesInHour {
    pub hour: DateTime<Utc>,
    pub outcome: String,
    pub count: i64,
}

/// The last 24 hours' deliveries by hour and outcome, for the overview's picture: those taken
/// through `deliveries_received`, those refused from `intake_refusals` (a row per source and
/// minute, a day kept). Every source's: a delivery's row does not name its source, and the
/// intake takes or refuses only those of configured sources.
pub async fn deliveries_by_hour(
    conn: &mut PgConnection,
) -> Result<Vec<DeliveriesInHour>, sqlx::Error> {
    sqlx::query_as!(
        DeliveriesInHour,
        r#"
        SELECT hour AS "hour!", outcome AS "outcome!", sum(n)::bigint AS "count!"
        FROM (
            SELECT date_trunc('hour', received_at, 'UTC') AS hour, verdict AS outcome,
                   count(*) AS n
            FROM deliveries
            WHERE received_at > inbox_now() - interval '24 hours'
            GROUP BY 1, 2
            UNION ALL
            SELECT date_trunc('hour', minute, 'UTC'), 'refused', sum(count)
            FROM intake_refusals
            WHERE minute > inbox_now() - interval '24 hours'
            GROUP BY 1
        ) taken
        GROUP BY 1, 2
        ORDER BY 1, 2
        "#
    )
    .fetch_all(exec(conn))
    .await
}
