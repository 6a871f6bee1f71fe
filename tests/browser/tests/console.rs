//! The console in a real browser (docs/design.md §12.7): an operator logs in with a
//! key, sees what needs them, replays a dead event and a dead meter report, reads why an
//! account is on its plan and what credit it holds, runs the Engine Room; a read-only key and
//! another customer's replay are refused. Each test
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
        // the admin API's answer, said in a sentence in the flash
        let answered = format!("Replayed event #{id}: it is ");
        browser
            .text_where("#flash", "tells the replay's answer", PAGE_WAIT, |t| {
                t.starts_with(&answered) && !t.contains('{')
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

/// A Stripe customer's account with a credit grant's register and two ledger entries, as the
/// worker's credits statements store them: 1000 usd of metered credit, granted, 300 applied,
/// expiring in 30 days.
async fn stripe_credit_rows(db: &sqlx::PgPool, customer: &str) -> anyhow::Result<String> {
    let grant = format!("credgr_{customer}");
    sqlx::query("INSERT INTO accounts (source, customer_id) VALUES ('stripe', $1)")
        .bind(customer)
        .execute(db)
        .await?;
    sqlx::query(
        "INSERT INTO credit_grants (source, customer_id, grant_id, origin, unit, scope, amount,
             category, priority, created_at, effective_at, expires_at, version_at, version_key,
             event_id)
         VALUES ('stripe', $1, $2, 'stripe_credit_grant', 'usd', 'price_type:metered', 1000,
             'paid', NULL, inbox_now() - interval '1 day', inbox_now() - interval '1 day',
             inbox_now() + interval '30 days', inbox_now() - interval '1 day', 'evt_' || $2, 0)",
    )
    .bind(customer)
    .bind(&grant)
    .execute(db)
    .await?;
    sqlx::query(
        "INSERT INTO credit_transactions (source, transaction_id, grant_id, kind, amount,
             effective_at, event_id)
         VALUES ('stripe', 'cbtxn_g_' || $1, $1, 'credits_granted', 1000,
                 inbox_now() - interval '1 day', 0),
                ('stripe', 'cbtxn_a_' || $1, $1, 'credits_applied', 300,
                 inbox_now() - interval '1 hour', 0)",
    )
    .bind(&grant)
    .execute(db)
    .await?;
    Ok(grant)
}

#[tokio::test]
async fn an_operator_reads_an_accounts_credits_and_each_grant() {
    let mut browser = Browser::open("account-credits").await.expect("a browser");
    let outcome = async {
        let stack = browser.stack.clone();
        let db = stack.database().await?;
        let customer = fresh_customer("cus_brw_credits");
        let grant = stripe_credit_rows(&db, &customer).await?;

        browser
            .log_in(&format!("accounts/stripe/{customer}"), &stack.admin_key)
            .await?;
        let row = "#credit-balances tr[data-unit='usd'][data-scope='price_type:metered']";
        browser
            .text_where(
                &format!("{row} td.available"),
                "700 available",
                PAGE_WAIT,
                |t| t == "700",
            )
            .await?;
        browser
            .text_where(
                &format!("#credit-grants tr[data-grant='{grant}'] td.remaining"),
                "700 usd remaining",
                PAGE_WAIT,
                |t| t == "700 usd",
            )
            .await?;
        browser.scroll_to("#credits").await?;
        browser.screenshot("account-credits").await?;
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
        let answered = format!("Replayed meter report {report}: it is pending now");
        browser
            .text_where("#flash", "tells the replay's answer", PAGE_WAIT, |t| {
                t.starts_with(&answered)
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
        // nine steps, after the setup delivery step 1 sends first (where "granted 490" in
        // step 1's reason comes from: the setup granted free's 10)
        let rows = browser.rows("#engine-steps").await?;
        anyhow::ensure!(
            rows == 10,
            "#engine-steps shows {rows} rows, not the setup and 9 deliveries"
        );
        browser
            .text_where(
                "#engine-steps tr[data-step='setup']",
                "names the setup delivery",
                PAGE_WAIT,
                |t| t.contains("plan-assigned") && t.contains("plan free"),
            )
            .await?;
        // Step 1 ends on pro with 500 either way: only the status, which the pipeline's
        // account has none of ("-"), is not the same, and it is not compared.
        let step_1 = browser
            .text_where(
                "#engine-steps tr[data-step='1'] td:last-child",
                "is step 1's on arrival",
                PAGE_WAIT,
                |t| !t.is_empty(),
            )
            .await?;
        anyhow::ensure!(
            !step_1.contains("differs"),
            "step 1 is marked as differing: {step_1}"
        );
        let step_2 = browser
            .attr(
                "#engine-steps tr[data-step='2'] td.differs",
                "data-differs",
                PAGE_WAIT,
            )
            .await?;
        anyhow::ensure!(step_2 == "balance", "step 2 differs on {step_2}");
        anyhow::Ok(())
    }
    .await;
    browser.finish(outcome).await;
}

#[tokio::test]
async fn a_read_only_key_is_offered_the_key_form_again_and_an_admin_key_opens_the_page() {
    let mut browser = Browser::open("read-only").await.expect("a browser");
    let outcome = async {
        let stack = browser.stack.clone();
        for page in ["", "events", "effects", "engine-room", "audit-trail"] {
            browser.console(page).await?;
            // the key form, given the read key; it comes back saying why
            browser
                .find("#key-form input#api-key")
                .await?
                .send_keys(&stack.read_key)
                .await?;
            browser
                .find("#key-form button[type='submit']")
                .await?
                .click()
                .await?;
            browser
                .text_where(
                    "#page p[role='alert']",
                    "says the key has no admin scope",
                    PAGE_WAIT,
                    |t| t.contains("no admin scope") && t.contains("403"),
                )
                .await
                .map_err(|e| e.context(format!("the page /console/{page}")))?;
            browser.find("#key-form input#api-key").await?;
            let name = if page.is_empty() { "overview" } else { page };
            browser.screenshot(&format!("{name}-forbidden")).await?;
        }
        // The admin API behind the pages refuses it too.
        let (status, body) = stack
            .api(Method::GET, "/v1/admin/overview", &stack.read_key)
            .await?;
        anyhow::ensure!(
            status == 403 && body["code"] == "forbidden",
            "GET /v1/admin/overview with the read key: {status} {body}"
        );
        // The form offered again takes an admin key, and the page opens.
        browser
            .find("#key-form input#api-key")
            .await?
            .send_keys(&stack.admin_key)
            .await?;
        browser
            .find("#key-form button[type='submit']")
            .await?
            .click()
            .await?;
        browser
            .text_where("#page h1", "is the audit trail", PAGE_WAIT, |t| {
                t == "Audit trail"
            })
            .await?;
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

/// Sends `kinde <kind>` for `customer` (with `--plan` when given) and waits until the worker
/// has applied (or ignored) it.
async fn kinde(
    stack: &Stack,
    db: &sqlx::PgPool,
    kind: &str,
    customer: &str,
    plan: Option<&str>,
) -> anyhow::Result<i64> {
    let mut args = vec!["kinde", kind, "--customer", customer];
    if let Some(plan) = plan {
        args.extend(["--plan", plan]);
    }
    let id = stack.send(&args).await?;
    stack
        .wait_event_status(db, id, &["applied", "ignored"], WORKER_WAIT)
        .await?;
    Ok(id)
}

/// The pages an operator opens, at a laptop's width and a narrow window's: each page's
/// screenshot at both, and none cuts a table behind a scrollbar.
const WIDTHS: [u32; 2] = [1400, 900];

/// A stack with what an operator must see first (a past-due account, a plan key the catalog
/// does not name, two accounts whose stored fields differ from their events, a dead event,
/// pending meter reports, a source that never received anything): each page says it at its
/// top, and every list fits the window.
#[tokio::test]
async fn each_page_says_at_its_top_what_needs_a_person() {
    let mut browser = Browser::open("truth").await.expect("a browser");
    let outcome = async {
        let stack = browser.stack.clone();
        let db = stack.database().await?;

        // A past-due account: on pro, then a payment that failed.
        let late = fresh_customer("kc_brw_late");
        kinde(&stack, &db, "plan-changed", &late, Some("pro")).await?;
        kinde(&stack, &db, "payment-failed", &late, None).await?;
        // A plan key the catalog does not name.
        let odd = fresh_customer("kc_brw_odd");
        kinde(&stack, &db, "plan-changed", &odd, Some("mystery")).await?;
        // Two accounts on pro whose registers are then moved by hand, as a bad migration or
        // a manual fix would: the scheduler's audit finds them.
        let moved = fresh_customer("kc_brw_moved");
        let grown = fresh_customer("kc_brw_grown");
        for customer in [&moved, &grown] {
            kinde(&stack, &db, "plan-changed", customer, Some("pro")).await?;
        }
        sqlx::query(
            "UPDATE customer_plans SET plan = 'team' WHERE source = 'kinde' AND customer_id = $1",
        )
        .bind(&moved)
        .execute(&db)
        .await?;
        sqlx::query(
            "UPDATE ledger SET delta = delta + 1 WHERE source = 'kinde' AND customer_id = $1",
        )
        .bind(&grown)
        .execute(&db)
        .await?;
        // A pending meter report: a debit's report, written as a metered source's is, its
        // next attempt a day away.
        let debit = stack
            .inboxctl(&["usage", "record", &late, "5", "--key", "brw-pending"])
            .await?;
        let usage_id = debit["usage_id"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no usage id in {debit}"))?;
        let pending: String = sqlx::query_scalar(
            "INSERT INTO meter_reports (id, source, customer_id, usage_id, idempotency_key,
                 identifier, meter, value, period, occurred_at, status, next_attempt_at)
             SELECT 'mrp_' || md5(usage_id), source, customer_id, usage_id, idempotency_key,
                    'bi_' || md5(usage_id), 'api_calls', amount, period, recorded_at, 'pending',
                    inbox_now() + interval '1 day'
             FROM usage_debits WHERE usage_id = $1
             RETURNING id",
        )
        .bind(usage_id)
        .fetch_one(&db)
        .await?;
        let dead = dead_event(&stack, &fresh_customer("kc_brw_truth_dead")).await?;
        // A meter month and a Stripe credit grant the provider audits found differing, as
        // their rows stand while the differences last.
        let metered = fresh_customer("cus_brw_meter");
        let credited = fresh_customer("cus_brw_credit");
        sqlx::query(
            "INSERT INTO meter_audit_differences (source, customer_id, period, meter, ours, theirs)
             VALUES ('stripe', $1, to_char(inbox_now(), 'YYYY-MM'), 'api_calls', 12, 9)",
        )
        .bind(&metered)
        .execute(&db)
        .await?;
        sqlx::query(
            "INSERT INTO credit_audit_differences (source, customer_id, grant_id, unit, ours, theirs)
             VALUES ('stripe', $1, 'credgr_brw', 'usd', '1000', '700'),
                    ('stripe', $1, 'credgr_brw_unknown', 'usd', NULL, '50')",
        )
        .bind(&credited)
        .execute(&db)
        .await?;
        wait_until(
            "the audit to find both accounts",
            scheduler_wait(),
            || async {
                let found: i64 = sqlx::query_scalar(
                    "SELECT count(DISTINCT customer_id) FROM audit_divergences
                 WHERE source = 'kinde' AND customer_id = ANY($1)",
                )
                .bind([moved.clone(), grown.clone()])
                .fetch_one(&db)
                .await?;
                Ok((found == 2).then_some(()))
            },
        )
        .await?;
        // A configured source that never received a delivery.
        let (_, overview) = stack
            .api(Method::GET, "/v1/admin/overview", &stack.admin_key)
            .await?;
        let unused = overview["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["last_delivery_at"].is_null())
            .and_then(|s| s["source"].as_str())
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("every source has a delivery: {overview}"))?;

        // The overview: the dead event first, what waits counted with its words, the unused
        // source no alarm.
        browser.log_in("", &stack.admin_key).await?;
        browser
            .find("#needs-attention li[data-kind='dead_events'] a[href*='status=dead']")
            .await?;
        // The provider audits' differences need a person too, and open the list of them.
        for kind in ["meter_differences", "credit_differences"] {
            browser
                .find(&format!(
                    "#needs-attention li[data-kind='{kind}'] a[href$='/console/divergences']"
                ))
                .await?;
        }
        browser
            .text_where(
                "#totals td[data-count='meter_reports_pending']",
                "counts the pending meter report",
                PAGE_WAIT,
                |t| t.parse::<u64>().is_ok_and(|n| n >= 1),
            )
            .await?;
        browser
            .text_where(
                &format!("#sources tr[data-source='{unused}'] td[data-last-delivery]"),
                "says no delivery yet",
                PAGE_WAIT,
                |t| t == "no delivery yet",
            )
            .await?;
        let attention = browser
            .text_where("#needs-attention", "is listed", PAGE_WAIT, |t| {
                !t.is_empty()
            })
            .await?;
        anyhow::ensure!(
            !attention.contains(&format!("Silent source · {unused}")),
            "an unused source is listed as needing a person: {attention}"
        );
        anyhow::ensure!(!attention.contains("(0)"), "a figure says (0): {attention}");
        browser.screenshot("overview").await?;
        // The picture's dead events of the last 24 hours are the list's (every event of this
        // stack was received within them).
        let pictured: u64 = browser
            .attr("#traffic-chart", "data-dead", PAGE_WAIT)
            .await?
            .parse()?;
        // (the table beside it is folded; its legend says the same totals, as the unit
        // tests check)
        let tabled: u64 = browser
            .text_where(
                "#traffic-chart .legend span[data-total='dead']",
                "totals the dead",
                PAGE_WAIT,
                |t| !t.is_empty(),
            )
            .await?
            .parse()?;
        browser.page("events?status=dead").await?;
        let listed = browser.rows("#events").await?;
        anyhow::ensure!(
            (pictured, tabled) == (listed, listed),
            "the picture counts {pictured} dead events, its legend {tabled}, the list {listed}"
        );
        browser.page("").await?;
        // The deliveries are drawn beside the events; the waiting bars hold the Waiting
        // table's numbers (the pending meter reports are compared with their list below).
        browser.find("#deliveries-chart svg").await?;
        let pending_bar: u64 = browser
            .attr(
                "#waiting-chart g[data-figure='meter_reports_pending'] rect",
                "data-count",
                PAGE_WAIT,
            )
            .await?
            .parse()?;

        // The divergences' item opens the list of every divergent account.
        browser
            .find("#needs-attention li[data-kind='divergences'] a[href$='/console/divergences']")
            .await?
            .click()
            .await?;
        for customer in [&moved, &grown] {
            browser
                .find(&format!("#divergences tr[data-account='kinde/{customer}']"))
                .await?;
        }
        browser
            .text_where("#divergences-summary", "counts them", PAGE_WAIT, |t| {
                t.contains("account(s) differ")
            })
            .await?;
        browser.screenshot("divergences").await?;
        // Below them, the provider audits' open differences, each row its account's.
        browser
            .find(&format!(
                "#meter-differences tr[data-account='stripe/{metered}'][data-meter='api_calls']"
            ))
            .await?;
        for grant in ["credgr_brw", "credgr_brw_unknown"] {
            browser
                .find(&format!(
                    "#credit-differences tr[data-account='stripe/{credited}'][data-grant='{grant}']"
                ))
                .await?;
        }
        browser.scroll_to("#credit-differences").await?;
        browser
            .text_where("#credit-differences", "says a side is missing", PAGE_WAIT, |t| {
                t.contains("not mirrored")
            })
            .await?;
        browser.screenshot("divergences-differences").await?;

        // The moved account: its header says the stored plan and what the events give, and
        // its finding opens the Why row.
        browser
            .find(&format!(
                "#divergences tr[data-account='kinde/{moved}'] a[href$='#why-customer_plan']"
            ))
            .await?
            .click()
            .await?;
        browser
            .text_where("#plan", "is the stored team", PAGE_WAIT, |t| t == "team")
            .await?;
        browser
            .text_where("#folded-plan", "is pro", PAGE_WAIT, |t| t == "pro")
            .await?;
        browser
            .text_where(
                "#account-findings li[data-finding='divergent']",
                "names the stored plan",
                PAGE_WAIT,
                |t| t.contains("Stored customer_plan is team, but its events give pro"),
            )
            .await?;
        browser
            .attr("#why-customer_plan", "open", PAGE_WAIT)
            .await?;
        browser.screenshot("account-divergent").await?;
        // Its plan in time: a point per change listed, each linked to its event.
        let points = browser.count("#plan-timeline g.plan-step").await?;
        let changes = browser.count("#plan-changes li").await?;
        anyhow::ensure!(
            points > 0 && points == changes,
            "the plan's timeline draws {points} changes and lists {changes}"
        );
        browser.find("#allowance-chart svg").await?;

        // The past-due account says so first; its link opens the standing's Why row.
        browser.page(&format!("accounts/kinde/{late}")).await?;
        let first = browser
            .attr("#account-findings li", "data-finding", PAGE_WAIT)
            .await?;
        anyhow::ensure!(first == "past-due", "the first finding is {first}");
        browser
            .find("#account-findings li[data-finding='past-due'] a[href='#why-standing']")
            .await?
            .click()
            .await?;
        browser.attr("#why-standing", "open", PAGE_WAIT).await?;
        browser.screenshot("account-past-due").await?;

        // The unknown plan key.
        browser.page(&format!("accounts/kinde/{odd}")).await?;
        browser
            .text_where(
                "#account-findings li[data-finding='unknown-plan-key']",
                "names the key",
                PAGE_WAIT,
                |t| t.contains("mystery is not in the catalog"),
            )
            .await?;
        browser.screenshot("account-unknown-key").await?;

        // The pending report is on the Meters page.
        browser.page("meters?status=pending").await?;
        browser
            .find(&format!("#meter-reports tr[data-report-id='{pending}']"))
            .await?;
        let listed = browser.rows("#meter-reports").await?;
        anyhow::ensure!(
            pending_bar == listed,
            "the overview's bar counts {pending_bar} pending meter reports, the list {listed}"
        );

        // Every list fits a laptop's window and a narrow one: no table cut.
        let pages = [
            ("overview", String::new()),
            ("events", "events".to_owned()),
            ("effects", "effects".to_owned()),
            ("meters", "meters".to_owned()),
            ("divergences", "divergences".to_owned()),
            ("audit-trail", "audit-trail".to_owned()),
            ("event", format!("events/{dead}")),
            ("account", format!("accounts/kinde/{late}")),
        ];
        let mut cut = Vec::new();
        for width in WIDTHS {
            browser.width(width).await?;
            for (name, path) in &pages {
                browser.page(path).await?;
                browser.screenshot(&format!("{name}-{width}")).await?;
                for table in browser.cut().await? {
                    cut.push(format!("{name} at {width}: {table}"));
                }
            }
        }
        anyhow::ensure!(cut.is_empty(), "cut behind a scrollbar: {cut:?}");
        anyhow::Ok(())
    }
    .await;
    browser.finish(outcome).await;
}
