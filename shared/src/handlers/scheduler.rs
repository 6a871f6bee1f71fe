//! The scheduler function's handler: one scheduled run — rescue what the queue lost, report
//! what died, compare the meter reports sent with the providers' meters, reconcile with the
//! providers, purge what is done, measure the backlog, audit a sample of accounts against the
//! fold of their events — and its metrics as one CloudWatch
//! EMF line. Every step is bounded in rows and time, safe to run twice at once, and fails
//! alone: one step's error is reported, the others still run.

use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use sqlx::PgPool;

use crate::audit::credits::{self as credit_audit, CreditDifference, CreditSource};
use crate::audit::{self, Divergence};
use crate::domain::Catalog;
use crate::effects::outbox::{EffectAlerts, Effects};
use crate::inbox::alerts::Alerts;
use crate::inbox::months;
use crate::inbox::purge::{self, kept_since, DroppedMonth};
use crate::inbox::read::{backlog, source_silence, Backlog, SourceSilence};
use crate::inbox::Events;
use crate::meters::audit::{self as meter_audit, Difference};
use crate::meters::outbox::{MeterReports, ReportAlerts};
use crate::meters::Meters;
use crate::platform::config::SchedulerConfig;
use crate::platform::queue::Queue;
use crate::platform::queued::{self, Rows};
use crate::reconcile::{self, ReconcileReport, Reconciler};
use crate::BoxFuture;

pub struct SchedulerState {
    pub pool: PgPool,
    pub queue: Queue,
    pub reconcilers: Vec<Reconciler>,
    /// Every configured source's name, whose silence each run measures.
    pub sources: Vec<String>,
    pub retention: Duration,
    /// Effects on: the dispatcher's queue, for effects the queue lost or that are due again.
    pub effects: Option<Queue>,
    /// The dispatcher's queue whenever it is configured, for the meter reports it lost.
    pub outbox: Option<Queue>,
    /// The run's time budget, well inside the function's timeout.
    pub budget: Duration,
    /// Where the pool's options come from, when it is a secret that a rotation changes
    /// (`None`: fixed options).
    pub database: Option<std::sync::Arc<crate::platform::database::Database>>,
    /// What the run's audit folds with (`None`: no audit).
    pub audit: Option<Audit>,
}

/// The sources and catalog the audit folds accounts with (docs/design.md §4.11), and how
/// many accounts a run takes at most; and the sources' meters whose totals the meter audit
/// compares with the reports sent (§4.13a; none: no meter audit); and the Stripe sources whose
/// mirrored credit grants the credits audit compares with Stripe's balances (§4.14; none: no
/// credits audit).
pub struct Audit {
    pub sources: audit::Sources,
    pub catalog: Catalog,
    pub max: i64,
    pub meters: Meters,
    pub meter_max: i64,
    pub credit_sources: Vec<CreditSource>,
    pub credit_max: i64,
}

impl Audit {
    pub fn new(sources: audit::Sources, catalog: Catalog) -> Self {
        Self {
            sources,
            catalog,
            max: audit::MAX_AUDITED_PER_RUN,
            meters: Meters::default(),
            meter_max: meter_audit::MAX_CHECKED_PER_RUN,
            credit_sources: Vec::new(),
            credit_max: credit_audit::MAX_CHECKED_PER_RUN,
        }
    }
}

impl SchedulerState {
    pub async fn from_config(config: &SchedulerConfig) -> anyhow::Result<Self> {
        crate::providers::check_sources(&config.sources)?;
        let database = crate::platform::database::Database::open(&config.database).await?;
        let pool = database.pool(2);
        let queue = Queue::from_env(config.queue_url.clone()).await;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        let configs = crate::platform::secrets::resolve(
            &config.sources,
            crate::platform::secrets::Needs::ApiKey,
            crate::platform::secrets::OnFailure::RetryOnUse("scheduler"),
        )
        .await?;
        // Reconciliation and the meter audit read through their sources' budgets.
        let client = crate::providers::ApiClient::budgeted(
            &http,
            crate::platform::budget::Budgets::new(pool.clone()),
            crate::platform::budget::Lane::Reads,
        );
        let reconcilers = reconcile::reconcilers(&configs, &client);
        let meters = Meters::build(&configs, &client);
        let credit_sources = configs
            .iter()
            .filter(|c| c.kind == crate::domain::SourceKind::Stripe)
            .filter_map(|c| {
                let api = crate::providers::Api::for_source(c, &client)?;
                Some(CreditSource {
                    source: c.name.clone(),
                    api,
                })
            })
            .collect();
        Ok(Self {
            pool,
            queue,
            reconcilers,
            sources: config.sources.iter().map(|s| s.name.clone()).collect(),
            retention: config.retention,
            effects: match &config.effects {
                Some(effects) => Some(Queue::from_env(effects.queue_url.clone()).await),
                None => None,
            },
            outbox: match &config.outbox_queue_url {
                Some(url) => Some(Queue::from_env(url.clone()).await),
                None => None,
            },
            budget: Duration::from_secs(50),
            database: Some(database),
            audit: Some(Audit {
                meters,
                credit_sources,
                ..Audit::new(audit::sources_of(&config.sources), config.catalog.clone())
            }),
        })
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    pub rescued: Vec<i64>,
    pub alerts: Alerts,
    pub reconciliation: Vec<ReconcileReport>,
    pub purged: u64,
    /// The months of events dropped whole this run (counted in `purged` too).
    pub dropped_months: Vec<DroppedMonth>,
    /// Events moved out of the kept partition into a month made this run: their month had no
    /// partition when they were stored (docs/design.md §3.14). Never more than 0 while the
    /// scheduler runs every month.
    pub moved_to_their_month: i64,
    pub backlog: Backlog,
    /// Effects re-enqueued (lost by the queue, or due for another attempt).
    pub rescued_effects: Vec<String>,
    /// Credits effects written at a time no event marked (docs/design.md §4.14).
    pub credits_told: u64,
    /// Sent effects older than the retention, deleted this run.
    pub purged_effects: u64,
    pub effect_alerts: EffectAlerts,
    /// Meter reports re-enqueued (lost by the queue, or due for another attempt).
    pub rescued_reports: Vec<String>,
    pub report_alerts: ReportAlerts,
    /// Open differences between the meter reports sent and the providers' meters, those
    /// first seen this run, and the accounts compared (docs/design.md §4.13a).
    pub meter_differences: u64,
    pub new_meter_differences: u64,
    pub meter_accounts_checked: u64,
    /// The first of those differences (all are in `meter_audit_differences`).
    pub meter_difference_list: Vec<Difference>,
    /// Open differences between Stripe-mirrored credit grants' balances and Stripe's, those
    /// first seen this run, and the accounts compared (docs/design.md §4.14).
    pub credit_differences: u64,
    pub new_credit_differences: u64,
    pub credit_accounts_checked: u64,
    /// The first of those differences (all are in `credit_audit_differences`).
    pub credit_difference_list: Vec<CreditDifference>,
    /// Each configured source's silence (hours since its newest stored event).
    pub silence: Vec<SourceSilence>,
    /// Accounts the audit compared with the fold of their events, and those it left for a
    /// later run (events in flight, too many events).
    pub audited: u64,
    pub audit_skipped: u64,
    /// Fields the audit found differing from the fold, and of them those first seen now.
    pub divergent: u64,
    pub new_divergent: u64,
    /// The first of those fields (all are in `audit_divergences`).
    pub divergences: Vec<Divergence>,
    /// Steps that failed, with their error; the others ran.
    pub errors: Vec<String>,
}

/// Differences the run's report names at most.
const MAX_REPORTED_DIVERGENCES: usize = 20;

/// One scheduled run.
#[tracing::instrument(skip_all)]
pub async fn run(state: &SchedulerState) -> RunReport {
    let deadline = Instant::now() + state.budget;
    let mut report = RunReport::default();
    // Effects and meter reports are rescued whenever their queue is configured, and counted
    // whenever they exist, so a stuck one is seen even after the sinks were turned off.
    let kinds = queued_kinds(state);
    // This month's and the next months' partitions, before anything is stored in them.
    match months::make_ahead(&state.pool).await {
        Ok(moved) => {
            report.moved_to_their_month = moved;
            if moved > 0 {
                tracing::error!(
                    alert = "month_made_late",
                    moved,
                    "events were stored in a month that had no partition of its own; moved into it"
                );
            }
        }
        Err(e) => report.errors.push(format!("months: {e:#}")),
    }
    // What credits tell at a time no event marks (an expiry, a void, an effective time;
    // docs/design.md §4.14), written before the rescue, which enqueues them.
    if state.effects.is_some() {
        let none = Catalog::default();
        let catalog = state.audit.as_ref().map_or(&none, |a| &a.catalog);
        match crate::effects::credits::tick(&state.pool, catalog, Utc::now()).await {
            Ok(told) => report.credits_told = told.len() as u64,
            Err(e) => report.errors.push(format!("credits: {e:#}")),
        }
    }
    for kind in &kinds {
        kind.rescue_and_alert(&state.pool, deadline, &mut report)
            .await;
    }
    // Each comparison is a provider read: an eighth of the budget at most, the accounts it
    // leaves wait their turn.
    if let Some(config) = state.audit.as_ref().filter(|a| !a.meters.is_empty()) {
        let until = deadline.min(Instant::now() + state.budget / 8);
        match meter_audit::run(&state.pool, &config.meters, None, config.meter_max, until).await {
            Ok(found) => {
                report.meter_differences = found.differences.len() as u64;
                report.new_meter_differences = found.new;
                report.meter_accounts_checked = found.checked;
                report.meter_difference_list = found.differences;
                report
                    .meter_difference_list
                    .truncate(MAX_REPORTED_DIVERGENCES);
                for error in found.errors {
                    tracing::warn!(error = %error, "meter audit: a provider's meter could not be read");
                }
            }
            Err(e) => report.errors.push(format!("meter audit: {e:#}")),
        }
    }
    // The credits audit: Stripe reads too, through the same read budget, another eighth.
    if let Some(config) = state
        .audit
        .as_ref()
        .filter(|a| !a.credit_sources.is_empty())
    {
        let until = deadline.min(Instant::now() + state.budget / 8);
        match credit_audit::run(
            &state.pool,
            &config.credit_sources,
            config.credit_max,
            until,
        )
        .await
        {
            Ok(found) => {
                report.credit_differences = found.differences.len() as u64;
                report.new_credit_differences = found.new;
                report.credit_accounts_checked = found.checked;
                report.credit_difference_list = found.differences;
                report
                    .credit_difference_list
                    .truncate(MAX_REPORTED_DIVERGENCES);
                for error in found.errors {
                    tracing::warn!(error = %error, "credits audit: Stripe's credits could not be read");
                }
            }
            Err(e) => report.errors.push(format!("credits audit: {e:#}")),
        }
    }
    // Lists the providers keep for longer than this store keeps events are read back only as
    // far as the purge has left everything in place.
    let kept = kept_since(state.retention, Utc::now());
    for reconciler in &state.reconcilers {
        if Instant::now() >= deadline {
            report.errors.push(format!(
                "reconcile {}: skipped, the run's time is up",
                reconciler.source()
            ));
            continue;
        }
        report
            .reconciliation
            .push(reconcile::run(reconciler, &state.pool, &state.queue, kept, deadline).await);
    }
    // The months past the retention go whole first; then each kind's purge by rows (the
    // events': what the kept partition holds).
    match purge::drop_months(&state.pool, state.retention).await {
        Ok(dropped) => report.dropped_months = dropped,
        Err(e) => report.errors.push(format!("purge months: {e:#}")),
    }
    for kind in &kinds {
        kind.purge(&state.pool, state.retention, deadline, &mut report)
            .await;
    }
    let dropped: i64 = report.dropped_months.iter().map(|m| m.dropped).sum();
    report.purged += u64::try_from(dropped).unwrap_or_default();
    let measured = async {
        let mut conn = state.pool.acquire().await?;
        backlog(&mut conn).await
    };
    match measured.await {
        Ok(b) => report.backlog = b,
        Err(e) => report.errors.push(format!("backlog: {e:#}")),
    }
    let silence = async {
        let mut conn = state.pool.acquire().await?;
        source_silence(&mut conn, &state.sources).await
    };
    match silence.await {
        Ok(s) => report.silence = s,
        Err(e) => report.errors.push(format!("silence: {e:#}")),
    }
    // The audit comes last and takes what is left of the budget, a quarter of it at most: it
    // is a check on the work, not the work, and a run that spent its time catching up should
    // leave the next tick on time rather than audit; the accounts it leaves wait their turn.
    if let Some(config) = &state.audit {
        let until = deadline.min(Instant::now() + state.budget / 4);
        match audit::run(
            &state.pool,
            &config.sources,
            &config.catalog,
            until,
            config.max,
        )
        .await
        {
            Ok(found) => {
                report.audited = found.checked;
                report.audit_skipped = found.skipped;
                report.divergent = found.divergent.len() as u64;
                report.new_divergent = found.new;
                report.divergences = found.divergent;
                report.divergences.truncate(MAX_REPORTED_DIVERGENCES);
            }
            Err(e) => report.errors.push(format!("audit: {e:#}")),
        }
    }
    for error in &report.errors {
        tracing::error!(error = %error, "scheduler step failed");
    }
    if let (false, Some(database)) = (report.errors.is_empty(), &state.database) {
        // The next run connects with what the secret holds now, if a rotation was the cause.
        database.after_pool_error().await;
    }
    // Metrics go to stdout as EMF documents, which CloudWatch turns into metrics: the run's,
    // then one per source with a silence to tell.
    let now = Utc::now();
    crate::platform::metrics::emit(emf(&report, now));
    for silence in &report.silence {
        if let Some(line) = silence_metric(silence, now) {
            crate::platform::metrics::emit(line);
        }
    }
    report
}

/// Each kind of queued row a run rescues, alerts on and purges, in the order it takes them:
/// the queue its lost rows go back to, and where its numbers go in the report.
fn queued_kinds(state: &SchedulerState) -> [Box<dyn QueuedSteps + '_>; 3] {
    [
        Box::new(QueuedKind::<Events> {
            queue: Some(&state.queue),
            rescued: |r| &mut r.rescued,
            alerts: |r| &mut r.alerts,
            purged: Some(|r| &mut r.purged),
        }),
        Box::new(QueuedKind::<Effects> {
            queue: state.effects.as_ref(),
            rescued: |r| &mut r.rescued_effects,
            alerts: |r| &mut r.effect_alerts,
            purged: Some(|r| &mut r.purged_effects),
        }),
        Box::new(QueuedKind::<MeterReports> {
            queue: state.outbox.as_ref(),
            rescued: |r| &mut r.rescued_reports,
            alerts: |r| &mut r.report_alerts,
            purged: None,
        }),
    ]
}

/// A kind of queued row as a run takes it.
struct QueuedKind<'a, R: Rows> {
    /// Where its lost rows go back to (`None`: not rescued this run).
    queue: Option<&'a Queue>,
    rescued: fn(&mut RunReport) -> &mut Vec<R::Id>,
    alerts: fn(&mut RunReport) -> &mut R::Alerts,
    /// `None`: the rows are kept.
    purged: Option<fn(&mut RunReport) -> &mut u64>,
}

/// A run's steps for one kind of queued row, each failing alone (its error goes to the
/// report, the next step runs): a trait object, so that the run loops over the kinds.
trait QueuedSteps: Sync {
    fn rescue_and_alert<'a>(
        &'a self,
        pool: &'a PgPool,
        deadline: Instant,
        report: &'a mut RunReport,
    ) -> BoxFuture<'a, ()>;

    fn purge<'a>(
        &'a self,
        pool: &'a PgPool,
        retention: Duration,
        deadline: Instant,
        report: &'a mut RunReport,
    ) -> BoxFuture<'a, ()>;
}

impl<R: Rows + 'static> QueuedSteps for QueuedKind<'_, R> {
    fn rescue_and_alert<'a>(
        &'a self,
        pool: &'a PgPool,
        deadline: Instant,
        report: &'a mut RunReport,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(queue) = self.queue {
                match queued::rescue::<R>(pool, queue, deadline).await {
                    Ok(ids) => *(self.rescued)(report) = ids,
                    Err(e) => report.errors.push(format!("rescue {}: {e:#}", R::NAME)),
                }
            }
            match R::alerts(pool).await {
                Ok(alerts) => *(self.alerts)(report) = alerts,
                Err(e) => report.errors.push(format!("alerts of {}: {e:#}", R::NAME)),
            }
        })
    }

    fn purge<'a>(
        &'a self,
        pool: &'a PgPool,
        retention: Duration,
        deadline: Instant,
        report: &'a mut RunReport,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let Some(purged) = self.purged else {
                return;
            };
            match queued::purge::<R>(pool, retention, deadline).await {
                Ok(n) => *purged(report) = n,
                Err(e) => report.errors.push(format!("purge {}: {e:#}", R::NAME)),
            }
        })
    }
}

/// The Embedded Metric Format line for one source's silence: `SourceSilenceHours` by `Stack`
/// and `Source`, a gauge that the silent-source alarm compares with its threshold per source.
/// None for a source with no stored event: nothing to measure from (a new source would
/// otherwise page before its provider's first delivery).
pub fn silence_metric(silence: &SourceSilence, now: DateTime<Utc>) -> Option<Value> {
    let hours = silence.hours?;
    let mut line =
        crate::platform::metrics::document(now, &[&["Source"]], &[("SourceSilenceHours", "None")]);
    line["Source"] = json!(silence.source);
    line["SourceSilenceHours"] = json!(hours);
    Some(line)
}

/// The run's metrics as one CloudWatch Embedded Metric Format document.
///
/// `DeadEvents` counts every dead event still unresolved (an alarm on it stays raised until an
/// operator replays or resolves them), `DeadEffects` likewise for effects, `StuckEffects` the
/// effects pending for more than 15 minutes; `ConflictEvents`, `UnprocessableEvents` and
/// `ReconcileDiscrepancies` count what this run found new; `ReconcileFailedReads` the
/// customers whose read failed this run and `ReconcileSkippedCustomers` those not read for
/// failing too many runs in a row; `StateDivergence` counts the fields the audit found
/// differing from the fold this run (a recorded difference is checked again every run, so it
/// counts for as long as it lasts) and `AccountsAudited` the accounts it compared;
/// `DeadMeterReports` counts the meter reports dead and not replayed (an alarm),
/// `PendingMeterReports` those on their way and `OldestPendingMeterReportSeconds` how long
/// the oldest has waited (an alarm past 3 hours), `MeterProviderErrors` those the provider took
/// and then said it could not count (Stripe's meter error reports, an alarm);
/// `MeterDifferences` counts the open differences between the meter reports sent and the
/// provider's meter totals (an alarm; it stays raised until the totals agree again);
/// `CreditDifferences` counts the open differences between Stripe-mirrored credit grants'
/// ledger balances and Stripe's (an alarm; raised until they agree again);
/// `StepErrors` counts the steps that failed in this run (their numbers are then missing or
/// zero).
pub fn emf(report: &RunReport, now: DateTime<Utc>) -> Value {
    let status = |s: &str| report.backlog.by_status.get(s).copied().unwrap_or(0);
    let discrepancies: i64 = report
        .reconciliation
        .iter()
        .map(|r| i64::from(r.discrepancies))
        .sum();
    // A failed step (or reconciliation source) makes the other numbers incomplete: say so.
    let step_errors = report.errors.len()
        + report
            .reconciliation
            .iter()
            .filter(|r| r.error.is_some())
            .count();
    // The feed furthest behind, and how many sources stopped before catching up.
    let behind = report
        .reconciliation
        .iter()
        .filter_map(|r| r.behind_secs)
        .fold(0.0, f64::max);
    let stopped_early = report
        .reconciliation
        .iter()
        .filter(|r| r.stopped_early)
        .count();
    // Customers the sweeps could not read this run, and those they skip for failing too often.
    let failed_reads: usize = report.reconciliation.iter().map(|r| r.failed.len()).sum();
    let skipped: usize = report.reconciliation.iter().map(|r| r.skipped.len()).sum();
    let effects = &report.effect_alerts;
    let reports = &report.report_alerts;
    let metrics: [(&str, f64, &str); 29] = [
        ("StepErrors", step_errors as f64, "Count"),
        ("DeadEvents", status("dead") as f64, "Count"),
        (
            "ConflictEvents",
            report.alerts.conflicts.len() as f64,
            "Count",
        ),
        (
            "UnprocessableEvents",
            report.alerts.unprocessable.len() as f64,
            "Count",
        ),
        ("ReconcileDiscrepancies", discrepancies as f64, "Count"),
        ("ReconcileBehindSeconds", behind, "Seconds"),
        ("ReconcileStoppedEarly", stopped_early as f64, "Count"),
        ("ReconcileFailedReads", failed_reads as f64, "Count"),
        ("ReconcileSkippedCustomers", skipped as f64, "Count"),
        ("RescuedEvents", report.rescued.len() as f64, "Count"),
        ("PurgedEvents", report.purged as f64, "Count"),
        (
            "EventsMovedToTheirMonth",
            report.moved_to_their_month as f64,
            "Count",
        ),
        (
            "OldestUnappliedAgeSeconds",
            report.backlog.oldest_unapplied_age_secs,
            "Seconds",
        ),
        ("ReceivedEvents", status("received") as f64, "Count"),
        ("ProcessingEvents", status("processing") as f64, "Count"),
        ("FailedEvents", status("failed") as f64, "Count"),
        ("DeadEffects", effects.dead_total as f64, "Count"),
        ("StuckEffects", effects.stuck as f64, "Count"),
        ("PendingEffects", effects.pending as f64, "Count"),
        (
            "RescuedEffects",
            report.rescued_effects.len() as f64,
            "Count",
        ),
        ("StateDivergence", report.divergent as f64, "Count"),
        ("AccountsAudited", report.audited as f64, "Count"),
        ("DeadMeterReports", reports.dead_total as f64, "Count"),
        ("PendingMeterReports", reports.pending as f64, "Count"),
        (
            "OldestPendingMeterReportSeconds",
            reports.oldest_pending_secs,
            "Seconds",
        ),
        (
            "MeterProviderErrors",
            reports.provider_errors as f64,
            "Count",
        ),
        (
            "RescuedMeterReports",
            report.rescued_reports.len() as f64,
            "Count",
        ),
        ("MeterDifferences", report.meter_differences as f64, "Count"),
        (
            "CreditDifferences",
            report.credit_differences as f64,
            "Count",
        ),
    ];
    let names: Vec<(&str, &str)> = metrics
        .iter()
        .map(|(name, _, unit)| (*name, *unit))
        .collect();
    let mut document = crate::platform::metrics::document(now, &[&[]], &names);
    for (name, value, _) in metrics {
        document[name] = json!(value);
    }
    document
}
