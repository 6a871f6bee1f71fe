//! The console in a real browser (docs/design.md §12.7): an operator logs in with a
//! key, sees what needs them, replays a dead event and a dead meter report, reads why an
//! account is on its plan, runs the Engine Room; a read-only key and another customer's replay are refused. Each test
//! drives its own headless Chromium against the running stack (scripts/e2e) and saves every
//! page it visits under CONSOLE_SCREENSHOTS.

use std::time::Duration;

use console_browser_tests::{
    event_status, fresh_customer, wait_until, Browser, Stack, PAGE_WAIT, WORKER_WAIT,
};
use fantoccini::Locator;
use reqwest::Method;
use serde_json::json;

/// The scheduler buries an event whose worker stopped during its last attempt on its next
/// tick (INBOX_TICK_SECS, 60 by default; scripts/e2e runs it every 5 s).
fn scheduler_wait() -> Duration {
    let tick: u64 = std::env::var("INBOX_TICK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(2 * tick + 15)
}

/// A dead event, made by the pipeline itself: a real delivery the worker applies, then left
/// as a worker that stopped during its 6th and last attempt leaves it (`processing`, its lease
/// run out, attempts 6; docs/design.md §3.7), which the scheduler's rescue buries as dead.
async fn dead_event(stack: &Stack, customer: &str) -> anyhow::Result<i64> {
    let db = stack.database().await?;
    let id = stack
        .send(&[
            "kinde",
            "plan-changed",
            "--customer",
            customer,
            "--plan",
            "pro",
        ])
        .await?;
    stack
        .wait_event_status(&db, id, &["applied", "ignored"], WORKER_WAIT)
        .await?;
    sqlx::query(
        "UPDATE inbox_events
         SET status = 'processing', attempts = 6, locked_until = inbox_now() - interval '1 second'
         WHERE id = $1",
    )
    .bind(id)
    .execute(&db)
    .await?;
    stack
        .wait_event_status(&db, id, &["dead"], scheduler_wait())
        .await?;
    Ok(id)
}

#[tokio::test]
async fn an_operator_sees_a_dead_event_replays_it_and_sees_it_applied() {
    let mut browser = Browser::open("dead-event").await.expect("a browser");
    let outcome = async {
        let stack = browser.stack.clone();
        let db = stack.database().await?;
        let id = dead_event(&stack, &fresh_customer("kc_brw_dead")).await?;

        // The overview counts it, and says it needs a person.
        browser.log_in("", &stack.admin_key).await?;
        browser
            .text_where(
                "#sources tr[data-source='kinde'] td[data-count='dead']",
                "counts a dead event",
                PAGE_WAIT,
                |t| t.parse::<u64>().is_ok_and(|n| n >= 1),
            )
            .await?;
        let attention = browser
            .find("#needs-attention a[href*='status=dead'][href*='source=kinde']")
            .await
            .map_err(|e| e.context("the overview links the dead kinde events"))?;
        browser.screenshot("overview").await?;

        // Its link lists them; the event is there.
        attention.click().await?;
        let row = format!("#events tr[data-event-id='{id}']");
        browser.find(&row).await?;
        browser.screenshot("events-dead").await?;
        browser
            .find(&format!("{row} a[href$='/console/events/{id}']"))
            .await?
            .click()
            .await?;

        // The event's page says it is dead; Replay puts it back, and the worker applies it.
        browser
            .text_where("#event-status", "is dead", PAGE_WAIT, |t| t == "dead")
            .await?;
        browser.find("#payload").await?;
        browser.screenshot("event-dead").await?;
        browser.find("#replay").await?.click().await?;
        // the admin API's answer, {"event_id": …, "status": …}, shown in the flash
        let answered = format!("\"event_id\":{id}");
        browser
            .text_where("#flash", "shows the replay's answer", PAGE_WAIT, |t| {
                t.replace(' ', "").contains(&answered)
            })
            .await?;
        browser.screenshot("event-replayed").await?;
        stack
            .wait_event_status(&db, id, &["applied", "ignored"], WORKER_WAIT)
            .await?;
        let client = browser.client().clone();
        let status = wait_until("the event page to show it applied", PAGE_WAIT, || async {
            client.refresh().await?;
            let shown = browser
                .text_where("#event-status", "shows a status", PAGE_WAIT, |t| {
                    !t.is_empty()
                })
                .await?;
            Ok(["applied", "ignored"]
                .contains(&shown.as_str())
                .then_some(shown))
        })
        .await?;
        anyhow::ensure!(status == "applied" || status == "ignored");
        browser.screenshot("event-applied").await?;

        // The replay is in the audit trail, under the admin key's name.
        browser.console("audit-trail").await?;
        browser
            .text_where("#trail", "names the replay's key", PAGE_WAIT, |t| {
                t.contains("dev-admin")
            })
            .await?;
        browser.screenshot("audit-trail").await?;

        // The effects the plan change wrote are listed.
        browser.console("effects").await?;
        browser.find("#effects").await?;
        browser.screenshot("effects").await?;
        anyhow::Ok(())
    }
    .await;
    browser.finish(outcome).await;
}

#[tokio::test]
async fn an_operator_reads_why_an_account_is_on_pro() {
    let mut browser = Browser::open("account-why").await.expect("a browser");
    let outcome = async {
        let stack = browser.stack.clone();
        let db = stack.database().await?;
        let customer = fresh_customer("kc_brw_why");
        // Pro now; then, arriving later, a change to free from an hour before, which loses.
        let pro = stack
            .send(&[
                "kinde",
                "plan-changed",
                "--customer",
                &customer,
                "--plan",
                "pro",
            ])
            .await?;
        let at = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
        let free = stack
            .send(&[
                "kinde",
                "plan-changed",
                "--customer",
                &customer,
                "--plan",
                "free",
                "--at",
                &at,
            ])
            .await?;
        for id in [pro, free] {
            stack
                .wait_event_status(&db, id, &["applied", "ignored"], WORKER_WAIT)
                .await?;
        }

        browser
            .log_in(&format!("accounts/kinde/{customer}"), &stack.admin_key)
            .await?;
        browser
            .text_where("#plan", "is pro", PAGE_WAIT, |t| t == "pro")
            .await?;
        browser.find("#log").await?;
        browser.screenshot("account").await?;

        // Why pro: the plan's field opens on the event that decided it, and the one it beat.
        browser.find("#why-plan summary").await?.click().await?;
        browser.attr("#why-plan", "open", PAGE_WAIT).await?;
        browser
            .find(&format!("#why-plan a[href$='/console/events/{pro}']"))
            .await
            .map_err(|e| e.context("the deciding event is linked"))?;
        browser
            .find(&format!("#why-plan a[href$='/console/events/{free}']"))
            .await
            .map_err(|e| e.context("the event it beat is linked"))?;
        browser.scroll_to("#why-plan").await?;
        browser.screenshot("account-why-plan").await?;
        anyhow::Ok(())
    }
    .await;
    browser.finish(outcome).await;
}

#[tokio::test]
async fn an_operator_finds_a_dead_meter_report_and_replays_it() {
    let mut browser = Browser::open("meters").await.expect("a browser");
    let outcome = async {
        let stack = browser.stack.clone();
        let db = stack.database().await?;
        let customer = fresh_customer("kc_brw_meter");
        let pro = stack
            .send(&[
                "kinde",
                "plan-changed",
                "--customer",
                &customer,
                "--plan",
                "pro",
            ])
            .await?;
        stack
            .wait_event_status(&db, pro, &["applied", "ignored"], WORKER_WAIT)
            .await?;
        let debit = stack
            .inboxctl(&["usage", "record", &customer, "5", "--key", "brw-meter"])
            .await?;
        let usage_id = debit["usage_id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no usage id in {debit}"))?;
        // The local stack's sources have no meter: the debit's report is written as a
        // metered source's is, then left as the dispatcher leaves one the provider refused.
        let report: String = sqlx::query_scalar(
            "INSERT INTO meter_reports (id, source, customer_id, usage_id, idempotency_key,
                 identifier, meter, value, period, occurred_at, status, attempts, last_error)
             SELECT 'mrp_' || md5(usage_id), source, customer_id, usage_id, idempotency_key,
                    'bi_' || md5(usage_id), 'api_calls', amount, period, recorded_at, 'dead', 1,
                    '400 Bad Request: Agreement not found'
             FROM usage_debits WHERE usage_id = $1
             RETURNING id",
        )
        .bind(usage_id)
        .fetch_one(&db)
        .await?;

        // The overview says it needs a person, and links the dead reports.
        browser.log_in("", &stack.admin_key).await?;
        browser
            .find("#needs-attention a[href$='meters?status=dead']")
            .await
            .map_err(|e| e.context("the overview links the dead meter reports"))?
            .click()
            .await?;
        let row = format!("#meter-reports tr[data-report-id='{report}']");
        browser.find(&row).await?;
        browser
            .text_where(&row, "says Kinde's reason", PAGE_WAIT, |t| {
                t.contains("Agreement not found")
            })
            .await?;
        browser.scroll_to(&row).await?;
        browser.screenshot("meters-dead").await?;

        // Replay: the admin API's answer in the flash, the report pending again.
        browser
            .find(&format!("{row} form button"))
            .await?
            .click()
            .await?;
        let answered = format!("\"report_id\":\"{report}\"");
        browser
            .text_where("#flash", "shows the replay's answer", PAGE_WAIT, |t| {
                t.replace(' ', "").contains(&answered)
            })
            .await?;
        browser.screenshot("meters-replayed").await?;
        let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM meter_reports WHERE id = $1")
            .bind(&report)
            .fetch_one(&db)
            .await?;
        anyhow::ensure!(attempts <= 1, "replayed with fresh attempts ({attempts})");

        browser.console("audit-trail").await?;
        browser
            .text_where("#trail", "names the meter replay", PAGE_WAIT, |t| {
                t.contains("meter_report.replay")
            })
            .await?;
        anyhow::Ok(())
    }
    .await;
    browser.finish(outcome).await;
}

#[tokio::test]
async fn the_engine_room_runs_nine_deliveries_to_pro_and_500() {
    let mut browser = Browser::open("engine-room").await.expect("a browser");
    let outcome = async {
        let stack = browser.stack.clone();
        browser.log_in("engine-room", &stack.admin_key).await?;
        // the page, or its word that this deployment has the Engine Room off
        let client = browser.client().clone();
        let page = wait_until("the Engine Room's page", PAGE_WAIT, || async {
            if client.find(Locator::Css("#engine-off")).await.is_ok() {
                return Ok(Some(None));
            }
            Ok(client
                .find(Locator::Css("select#scenario"))
                .await
                .ok()
                .map(Some))
        })
        .await?;
        let Some(scenario) = page else {
            browser.screenshot("engine-room-off").await?;
            anyhow::bail!("the Engine Room is off in this stack (#engine-off)");
        };
        scenario.select_by_value("nine-deliveries").await?;
        browser.screenshot("engine-room").await?;
        browser.find("#run").await?.click().await?;
        // nine deliveries, each waited for until the worker has its event; a run that stops
        // says so in the result at once
        let client = browser.client().clone();
        let plan = wait_until(
            "#engine-result[data-plan]",
            Duration::from_secs(150),
            || async {
                let result = client.find(Locator::Css("#engine-result")).await?;
                if let Some(plan) = result.attr("data-plan").await? {
                    return Ok(Some(Ok(plan)));
                }
                let text = result.text().await?;
                Ok(text.starts_with("Stopped").then_some(Err(text)))
            },
        )
        .await?
        .map_err(|stopped| anyhow::anyhow!("the run stopped: {stopped}"))?;
        let balance = browser
            .attr("#engine-result", "data-balance", PAGE_WAIT)
            .await?;
        browser.scroll_to("#engine-result").await?;
        browser.screenshot("engine-room-result").await?;
        anyhow::ensure!(
            (plan.as_str(), balance.as_str()) == ("pro", "500"),
            "the run ended on plan {plan} with balance {balance}, not pro with 500"
        );
        let steps = browser.rows("#engine-steps").await?;
        anyhow::ensure!(steps == 9, "#engine-steps shows {steps} deliveries, not 9");
        anyhow::Ok(())
    }
    .await;
    browser.finish(outcome).await;
}

#[tokio::test]
async fn a_read_only_key_is_refused_the_admin_pages() {
    let mut browser = Browser::open("read-only").await.expect("a browser");
    let outcome = async {
        let stack = browser.stack.clone();
        browser.log_in("", &stack.read_key).await?;
        for page in ["", "events", "effects", "engine-room", "audit-trail"] {
            if !page.is_empty() {
                browser.console(page).await?;
            }
            browser
                .text_where("#error", "says forbidden", PAGE_WAIT, |t| {
                    t.contains("forbidden")
                })
                .await
                .map_err(|e| e.context(format!("the page /console/{page}")))?;
            let name = if page.is_empty() { "overview" } else { page };
            browser.screenshot(&format!("{name}-forbidden")).await?;
        }
        // The admin API behind the pages refuses it too; the key stays in the tab (a 403 is
        // not a 401), so the key form is not shown again.
        let (status, body) = stack
            .api(Method::GET, "/v1/admin/overview", &stack.read_key)
            .await?;
        anyhow::ensure!(
            status == 403 && body["code"] == "forbidden",
            "GET /v1/admin/overview with the read key: {status} {body}"
        );
        anyhow::ensure!(
            browser
                .client()
                .find(Locator::Css("#key-form"))
                .await
                .is_err(),
            "the key form came back after a 403"
        );
        anyhow::Ok(())
    }
    .await;
    browser.finish(outcome).await;
}

/// The app route, over HTTP: a customer's replay names only its own events; another's is 404
/// `not_found` exactly as a missing one, and is left as it was.
#[tokio::test]
async fn a_customer_cannot_replay_another_customers_event() {
    let stack = Stack::from_env();
    let db = stack.database().await.expect("the database");
    let a = fresh_customer("kc_brw_a");
    let b = fresh_customer("kc_brw_b");
    let mut ids = Vec::new();
    for customer in [&a, &b] {
        let id = stack
            .send(&[
                "kinde",
                "plan-changed",
                "--customer",
                customer,
                "--plan",
                "pro",
            ])
            .await
            .expect("a delivery");
        stack
            .wait_event_status(&db, id, &["applied", "ignored"], WORKER_WAIT)
            .await
            .expect("applied");
        ids.push(id);
    }
    let (own, others) = (ids[0], ids[1]);
    let replay = |event: i64| {
        let stack = stack.clone();
        let a = a.clone();
        async move {
            stack
                .api(
                    Method::POST,
                    &format!("/v1/accounts/kinde/{a}/events/{event}/replay"),
                    &stack.api_key,
                )
                .await
                .expect("an answer")
        }
    };
    let before: (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM inbox_events WHERE id = $1")
            .bind(others)
            .fetch_one(&db)
            .await
            .unwrap();

    let (status, body) = replay(others).await;
    let (missing_status, missing) = replay(others + 1_000_000_000).await;
    let (own_status, own_body) = replay(own).await;

    assert_eq!(
        (status, &body["code"]),
        (404, &json!("not_found")),
        "{body}"
    );
    assert_eq!(
        (missing_status, &missing["code"]),
        (404, &json!("not_found")),
        "a missing event: {missing}"
    );
    assert_eq!(
        (own_status, &own_body["event_id"]),
        (200, &json!(own)),
        "the customer's own event is replayed: {own_body}"
    );
    let after: (String, i32) =
        sqlx::query_as("SELECT status, attempts FROM inbox_events WHERE id = $1")
            .bind(others)
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(after, before, "the other customer's event was left alone");
    assert!(
        ["applied", "ignored", "received", "processing"]
            .contains(&event_status(&db, own).await.unwrap().as_str()),
        "the own event is replayed or applied again"
    );
}
