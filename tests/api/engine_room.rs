//! The Engine Room (docs/design.md §12.5): the reference scenarios run on a fresh customer of a
//! test-mode source through the real intake in process, the worker consuming the queue, each
//! step beside what applying on arrival gives; and `inboxctl scenario`, which runs the same
//! scripts against a served intake.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use shared::handlers::engine_room::{EngineRoom, StepAnswer};
use shared::platform::config::{ApiConfig, FromEnv};
use sqlx::PgPool;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::cli::{database_url, dev_sources, inboxctl, run, serve_intake};
use crate::helpers::*;

/// Plays the event source mapping (the real bridge, this app's worker) until `stop` is set.
async fn pump_until(app: &TestApp, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        app.run_worker().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `inboxctl scenario <name> [--json]` against `intake`, the worker consuming meanwhile.
async fn scenario_cli(app: &TestApp, intake: &str, url: &str, name: &str, json: bool) -> String {
    let stop = AtomicBool::new(false);
    let (intake, url, name) = (intake.to_owned(), url.to_owned(), name.to_owned());
    let cli = tokio::task::spawn_blocking(move || {
        let key = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/kinde_test_key_a.pem");
        let mut command = inboxctl();
        command
            .args(["scenario", &name, "--intake-url", &intake])
            .env("DATABASE_URL", &url)
            .env("INBOX_SOURCES", dev_sources(None))
            .env("INBOX_DEV_KINDE_KEY", key)
            .env("INBOX_DEV_KINDE_KID", KINDE_KID);
        if json {
            command.arg("--json");
        }
        run(&mut command)
    });
    let ((output, stdout, stderr), ()) = tokio::join!(
        async {
            let done = cli.await.unwrap();
            stop.store(true, Ordering::SeqCst);
            done
        },
        pump_until(app, &stop)
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    stdout
}

/// The naive columns of a timeline, one `plan/balance/status` per step.
fn naive_columns(timeline: &Value) -> Vec<String> {
    timeline
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            format!(
                "{}/{}/{}",
                row["naive_plan"].as_str().unwrap(),
                row["naive_balance"],
                row["naive_status"].as_str().unwrap()
            )
        })
        .collect()
}

/// What applying each of the nine deliveries on arrival leaves, step by step.
const NINE_ON_ARRIVAL: [&str; 9] = [
    "pro/500/active",
    "pro/990/active",
    "pro/1480/active",
    "pro/1970/active",
    "pro/2460/active",
    "pro/2950/active",
    "free/2950/canceled",
    "free/2950/canceled",
    "free/2950/canceled",
];

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn inboxctl_scenario_runs_the_nine_deliveries_beside_applying_on_arrival(pool: PgPool) {
    let url = database_url(&pool).await;
    let app = Arc::new(TestApp::spawn(pool).await);
    let intake = serve_intake(app.clone()).await;

    let stdout = scenario_cli(&app, &intake, &url, "nine-deliveries", true).await;
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let last = &report["final"];
    assert_eq!(
        (&last["plan"], &last["balance"], &last["status"]),
        (&"pro".into(), &500.into(), &"paid".into()),
        "{report}"
    );
    assert_eq!(naive_columns(&report["timeline"]), NINE_ON_ARRIVAL);
    let deliveries: Vec<&str> = report["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["delivery"].as_str().unwrap())
        .collect();
    assert_eq!(
        deliveries,
        [
            "plan-changed",
            "plan-changed",
            "plan-changed",
            "payment-succeeded pay_1",
            "payment-succeeded pay_1",
            "payment-succeeded pay_1",
            "agreement-cancelled",
            "payment-succeeded pay_1",
            "payment-succeeded pay_1",
        ]
    );

    let text = scenario_cli(&app, &intake, &url, "status", false).await;
    assert!(
        text.contains(
            "billing-inbox: free, balance 500, status past_due | applied on arrival: free, balance 10, status active"
        ),
        "{text}"
    );
}

/// The test sources, Kinde's verified with a JWKS that serves the test key's public half
/// (key a).
struct Stage {
    app: TestApp,
    url: String,
    sources: String,
    _jwks: MockServer,
}

async fn stage(pool: PgPool) -> Stage {
    let url = database_url(&pool).await;
    let app = TestApp::spawn(pool).await;
    let jwks = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/.well-known/jwks"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(
            include_str!("../../testdata/jwks_a.json"),
            "application/json",
        ))
        .mount(&jwks)
        .await;
    let jwks_url = format!("{}/.well-known/jwks", jwks.uri());
    let local = shared::providers::fixtures::Local {
        jwks_url: &jwks_url,
    };
    let sources = shared::providers::fixtures::dev_sources(&local).to_string();
    Stage {
        app,
        url,
        sources,
        _jwks: jwks,
    }
}

/// A key list of one admin key (its hash only).
const API_KEYS: &str = r#"[{"name":"ops","sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["admin"]}]"#;

const KINDE_KEY_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/kinde_test_key_a.pem");

impl Stage {
    /// The api function's configuration, with `INBOX_SOURCES` as given and
    /// `INBOX_ENGINE_ROOM` set to `engine_room`.
    fn config(&self, sources: &str, engine_room: &str) -> Result<ApiConfig, String> {
        let vars = [
            ("DATABASE_URL", self.url.as_str()),
            ("INBOX_SOURCES", sources),
            ("INBOX_PLANS", PLANS),
            ("INBOX_API_KEYS", API_KEYS),
            ("QUEUE_URL", self.app.queue_url.as_str()),
            ("INBOX_ENGINE_ROOM", engine_room),
        ];
        ApiConfig::from_lookup(|var| {
            vars.iter()
                .find(|(name, _)| *name == var)
                .map(|(_, value)| value.to_string())
        })
        .map_err(|e| e.to_string())
    }

    /// The Engine Room as the api function opens it at cold start, on the development sources
    /// its scenarios run on (Kinde signed with the test key), waiting as long as the worker
    /// here needs.
    async fn room(&self) -> EngineRoom {
        self.room_signing_kinde_with(KINDE_KEY_FILE).await
    }

    async fn room_signing_kinde_with(&self, kinde_key_file: &str) -> EngineRoom {
        let engine_room = json!({
            "sources": ["kinde", "polar", "stripe", "paddle", "lemonsqueezy"],
            "kinde_key_file": kinde_key_file,
            "kinde_kid": KINDE_KID,
        });
        let config = self
            .config(&self.sources, &engine_room.to_string())
            .unwrap();
        let mut room = EngineRoom::open(&config).await.unwrap().expect("on");
        // A bound, not a measure: the test's worker shares the machine.
        room.wait = Duration::from_secs(60);
        room
    }

    /// Step `n` of `run`, the worker consuming the queue meanwhile.
    async fn step(&self, room: &EngineRoom, run: &str, n: usize) -> StepAnswer {
        let stop = AtomicBool::new(false);
        let mut conn = self.app.pool.acquire().await.unwrap();
        let (answer, ()) = tokio::join!(
            async {
                let answer = room.step(&mut conn, run, n).await;
                stop.store(true, Ordering::SeqCst);
                answer
            },
            pump_until(&self.app, &stop)
        );
        answer.unwrap()
    }
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_engine_room_runs_the_nine_deliveries_to_pro_500_beside_applying_on_arrival(
    pool: PgPool,
) {
    let stage = stage(pool).await;
    let room = stage.room().await;
    let offered: Vec<(&str, Option<String>, usize)> = room
        .scenarios()
        .iter()
        .map(|s| (s.name, s.source.clone(), s.steps.len()))
        .collect();
    assert_eq!(
        offered,
        [
            ("nine-deliveries", Some("kinde".into()), 9),
            ("subscriptions", Some("polar".into()), 7),
            ("status", Some("stripe".into()), 3),
            ("refund", Some("polar".into()), 3),
            ("status-paddle", Some("paddle".into()), 3),
            ("refund-lemonsqueezy", Some("lemonsqueezy".into()), 3),
            // Offered only on a Stripe source whose provider API is given (the fakes').
            ("status-thin", None, 3),
        ]
    );

    assert_eq!(
        serde_json::to_value(&room.scenarios()[2]).unwrap(),
        json!({"name": "status", "source": "stripe", "setup": null, "steps": [
            {"step": 1, "what": "subscription sub_status trialing, plan price_pro, at the start"},
            {"step": 2, "what": "subscription sub_status past_due, plan price_pro, minute 2"},
            {"step": 3, "what": "subscription sub_status active, plan price_pro, minute 1"},
        ]})
    );

    let run = room.start("nine-deliveries").unwrap();
    assert_eq!(
        (run.scenario, run.source.as_str(), run.steps),
        ("nine-deliveries", "kinde", 9)
    );
    assert!(run.customer.starts_with("er_"), "{}", run.customer);
    assert_eq!(run.run, format!("nine-deliveries.{}", run.customer));
    let mut answers = Vec::new();
    for n in 1..=run.steps {
        answers.push(stage.step(&room, &run.run, n).await);
    }

    let verdicts: Vec<(u16, &str)> = answers
        .iter()
        .map(|a| (a.answer.status, a.answer.verdict.as_str()))
        .collect();
    let (stored, copy) = ((200, "stored"), (200, "duplicate"));
    assert_eq!(
        verdicts,
        [stored, copy, copy, stored, copy, copy, stored, copy, copy]
    );
    let on_arrival: Vec<String> = answers
        .iter()
        .map(|a| {
            let line = &a.on_arrival.0;
            format!("{}/{}/{}", line.plan, line.balance, line.status)
        })
        .collect();
    assert_eq!(on_arrival, NINE_ON_ARRIVAL, "what inboxctl scenario shows");
    // Every event finished by the worker; the late cancellation ignored with its reason.
    for answer in &answers {
        let event = answer.event.as_ref().expect("stored");
        let expected = if answer.step == 7 {
            "ignored"
        } else {
            "applied"
        };
        assert_eq!(
            (event.status, event.outcome.as_deref()),
            (expected, Some(expected))
        );
    }
    let cancel = serde_json::to_value(&answers[6]).unwrap();
    assert_eq!(
        cancel["event"]["reason"], "a newer plan change is already stored",
        "{cancel}"
    );
    assert_eq!(cancel["what"], "agreement-cancelled, minute 7");
    let last = serde_json::to_value(&answers[8]).unwrap();
    assert_eq!(
        (
            &last["step"],
            &last["answer"],
            &last["account"],
            &last["on_arrival"]
        ),
        (
            &json!(9),
            &json!({"status": 200, "verdict": "duplicate"}),
            &json!({"plan": "pro", "balance": 500, "status": "paid"}),
            &json!({"plan": "free", "balance": 2950, "status": "canceled"}),
        )
    );
    // The starting point and the three events of the script, once each; six copies counted.
    let app = &stage.app;
    let customer_events = format!(
        "SELECT count(*) FROM inbox_events WHERE source = 'kinde' AND customer_key = '{}'",
        run.customer
    );
    assert_eq!(app.count(&customer_events).await, 4);
    assert_eq!(
        app.count("SELECT coalesce(sum(seen_count - 1), 0)::bigint FROM inbox_events")
            .await,
        6
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_second_run_gets_another_customer_and_stripes_deliveries_are_test_mode(pool: PgPool) {
    let stage = stage(pool).await;
    let room = stage.room().await;
    let first = room.start("status").unwrap();
    let second = room.start("status").unwrap();
    assert_ne!(first.customer, second.customer);
    assert_ne!(first.run, second.run);

    let mut last = None;
    for n in 1..=first.steps {
        last = Some(stage.step(&room, &first.run, n).await);
    }
    let last = last.unwrap();
    // trialing → past_due, with `active` landing last: past_due, beside on arrival's active.
    assert_eq!(
        serde_json::to_value((&last.account, &last.on_arrival)).unwrap(),
        json!([
            {"plan": "free", "balance": 500, "status": "past_due"},
            {"plan": "free", "balance": 10, "status": "active"}
        ])
    );
    let other = stage.step(&room, &second.run, 1).await;
    let (a, b) = (
        last.event.as_ref().unwrap().event_id,
        other.event.as_ref().unwrap().event_id,
    );
    assert_ne!(a, b, "each run's events are its own");
    assert_eq!(other.answer.verdict, "stored");
    for id in [a, b] {
        let event = stage.app.event(id).await;
        assert_eq!(event.source, "stripe");
        assert_eq!(event.payload.unwrap()["livemode"], false, "test mode");
    }
    assert_eq!(
        stage.app.event(b).await.customer_key.as_deref(),
        Some(second.customer.as_str())
    );
}

/// The subscriptions scenario spans four months: a run's provider times all lie in the past,
/// so the worker trusts every one (none is more than a day ahead) and the plan follows
/// docs/design.md §4.9 step by step.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_subscriptions_scenario_runs_in_the_past_and_ends_free(pool: PgPool) {
    let stage = stage(pool).await;
    let room = stage.room().await;
    let run = room.start("subscriptions").unwrap();
    let mut plans = Vec::new();
    for n in 1..=run.steps {
        let answer = stage.step(&room, &run.run, n).await;
        let event = answer.event.as_ref().unwrap();
        assert!(
            ["applied", "ignored"].contains(&event.status),
            "step {n}: {answer:?}"
        );
        assert!(answer.provider_time < chrono::Utc::now(), "step {n}");
        plans.push(answer.account.plan.clone());
    }
    assert_eq!(plans, ["pro", "free", "free", "pro", "pro", "pro", "free"]);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_unknown_scenario_a_bad_run_or_step_or_a_forged_delivery_is_refused_and_stores_nothing(
    pool: PgPool,
) {
    let stage = stage(pool).await;
    let room = stage.room().await;
    let refused = room.start("ten-deliveries").unwrap_err();
    assert_eq!(
        (refused.code(), refused.status().as_u16()),
        ("unknown_scenario", 400)
    );
    assert_eq!(
        refused.to_string(),
        "unknown scenario 'ten-deliveries'; the scenarios are nine-deliveries, subscriptions, status, refund, status-paddle, refund-lemonsqueezy and status-thin"
    );

    let run = room.start("refund").unwrap();
    let mut conn = stage.app.pool.acquire().await.unwrap();
    for (run, step, code) in [
        (run.run.as_str(), 0, "bad_step"),
        (run.run.as_str(), 4, "bad_step"),
        ("refund.cus_live_customer", 1, "bad_run"),
        ("nine-deliveries", 1, "bad_run"),
    ] {
        let refused = room.step(&mut conn, run, step).await.unwrap_err();
        assert_eq!(
            (refused.code(), refused.status().as_u16()),
            (code, 404),
            "{run} {step}"
        );
    }
    let refused = room.step(&mut conn, &run.run, 4).await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "step 4 is not a step of refund: its steps are 1 to 3"
    );
    assert_eq!(
        stage.app.count("SELECT count(*) FROM inbox_events").await,
        0
    );
    assert_eq!(stage.app.count("SELECT count(*) FROM deliveries").await, 0);

    // Signed with a key the source's JWKS does not serve: the intake's refusal is the answer.
    let forger = stage
        .room_signing_kinde_with(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/kinde_test_key_b.pem"
        ))
        .await;
    let run = forger.start("nine-deliveries").unwrap();
    let refused = stage.step(&forger, &run.run, 2).await;
    assert_eq!(
        serde_json::to_value(&refused).unwrap()["answer"],
        json!({"status": 401, "verdict": "unauthorized", "detail": refused.answer.detail})
    );
    assert!(refused.event.is_none());
    assert_eq!(
        serde_json::to_value(&refused.account).unwrap(),
        json!({"plan": "free", "balance": 0, "status": "-"})
    );
    assert_eq!(
        stage.app.count("SELECT count(*) FROM inbox_events").await,
        0
    );
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_engine_room_naming_a_live_mode_or_unknown_source_is_refused_at_cold_start(
    pool: PgPool,
) {
    let stage = stage(pool).await;
    let mut sources: Value = serde_json::from_str(&stage.sources).unwrap();
    for source in sources.as_array_mut().unwrap() {
        if source["name"] == "stripe" {
            source["livemode"] = json!(true);
        }
    }
    let config = stage
        .config(&sources.to_string(), r#"{"sources":["stripe"]}"#)
        .unwrap();
    let live = EngineRoom::open(&config).await.err().unwrap().to_string();
    assert_eq!(
        live,
        "INBOX_ENGINE_ROOM: sources: 'stripe' is a live-mode source (livemode: true in INBOX_SOURCES): the Engine Room runs only on test-mode sources"
    );
    let config = stage
        .config(&stage.sources, r#"{"sources":["stripe-test"]}"#)
        .unwrap();
    let unknown = EngineRoom::open(&config).await.err().unwrap().to_string();
    assert_eq!(
        unknown,
        "INBOX_ENGINE_ROOM: sources: 'stripe-test' is not a source of INBOX_SOURCES (its sources: kinde, stripe, polar, lemonsqueezy, paddle)"
    );
    // A Kinde source without the key its JWKS serves cannot be signed for.
    let config = stage
        .config(&stage.sources, r#"{"sources":["kinde"]}"#)
        .unwrap();
    let unsigned = EngineRoom::open(&config).await.err().unwrap().to_string();
    assert!(
        unsigned.starts_with("INBOX_ENGINE_ROOM: sources: 'kinde' is a kinde source, whose provider signs with a private key of its own"),
        "{unsigned}"
    );

    // Stripe alone: its scenario runs; the others say what they lack.
    let config = stage
        .config(&stage.sources, r#"{"sources":["stripe"]}"#)
        .unwrap();
    let room = EngineRoom::open(&config).await.unwrap().unwrap();
    let sources: Vec<Option<String>> = room.scenarios().into_iter().map(|s| s.source).collect();
    assert_eq!(
        sources,
        [None, None, Some("stripe".into()), None, None, None, None]
    );
    let refused = room.start("nine-deliveries").unwrap_err();
    assert_eq!(
        (refused.code(), refused.status().as_u16(), refused.to_string().as_str()),
        (
            "scenario_unavailable",
            409,
            "scenario nine-deliveries runs on a kinde source, and INBOX_ENGINE_ROOM names no test-mode one"
        )
    );
    // Unset: off.
    let off = ApiConfig::from_lookup(|var| match var {
        "DATABASE_URL" => Some(stage.url.clone()),
        "INBOX_SOURCES" => Some(stage.sources.clone()),
        "INBOX_PLANS" => Some(PLANS.into()),
        "INBOX_API_KEYS" => Some(API_KEYS.into()),
        _ => None,
    })
    .unwrap();
    assert!(EngineRoom::open(&off).await.unwrap().is_none());
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_admin_api_runs_the_engine_room_and_answers_engine_room_off_without_it(pool: PgPool) {
    use crate::app_api::{api_state, call, ADMIN_KEY, READER_KEY};
    let stage = stage(pool.clone()).await;
    let mut state = api_state(&pool);
    let off = call(
        &state,
        "GET",
        "/v1/admin/engine-room",
        Some(ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(
        (off.status.as_u16(), off.body["code"].as_str()),
        (404, Some("engine_room_off"))
    );
    let mut room = stage.room().await;
    // Within the handler's own budget (5 s without an invocation deadline).
    room.wait = Duration::from_secs(4);
    state.engine_room = Some(room);

    let listed = call(
        &state,
        "GET",
        "/v1/admin/engine-room",
        Some(ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(listed.body["scenarios"].as_array().map(Vec::len), Some(7));
    let refused = call(
        &state,
        "GET",
        "/v1/admin/engine-room",
        Some(READER_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(refused.status.as_u16(), 403);
    let unknown = call(
        &state,
        "POST",
        "/v1/admin/engine-room/runs",
        Some(ADMIN_KEY),
        &[],
        Some(json!({"scenario": "ten-deliveries"})),
    )
    .await;
    assert_eq!(unknown.body["code"], "unknown_scenario");

    let run = call(
        &state,
        "POST",
        "/v1/admin/engine-room/runs",
        Some(ADMIN_KEY),
        &[],
        Some(json!({"scenario": "nine-deliveries"})),
    )
    .await;
    assert_eq!(run.status.as_u16(), 200, "{}", run.body);
    let id = run.body["run"].as_str().unwrap().to_owned();
    let mut last = json!(null);
    for n in 1..=9 {
        let stop = AtomicBool::new(false);
        let path = format!("/v1/admin/engine-room/runs/{id}/steps/{n}");
        let (answer, ()) = tokio::join!(
            async {
                let answer = call(&state, "POST", &path, Some(ADMIN_KEY), &[], None).await;
                stop.store(true, Ordering::SeqCst);
                answer
            },
            pump_until(&stage.app, &stop)
        );
        assert_eq!(answer.status.as_u16(), 200, "{}", answer.body);
        last = answer.body;
    }
    assert_eq!(
        (
            last["account"]["plan"].as_str(),
            last["account"]["balance"].as_i64()
        ),
        (Some("pro"), Some(500))
    );
    let bad_step = call(
        &state,
        "POST",
        &format!("/v1/admin/engine-room/runs/{id}/steps/10"),
        Some(ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(bad_step.body["code"], "bad_step");
    let trail = call(
        &state,
        "GET",
        "/v1/admin/audit-trail",
        Some(ADMIN_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(trail.body["actions"][0]["action"], "engine_room.run");
    assert_eq!(trail.body["actions"][0]["target"], id.as_str());
}

/// Status on Paddle Billing and refund on Lemon Squeezy orders, run on those kinds' test-mode
/// sources: each delivery stored and finished by the worker, and each run ends where the
/// provider's order says (`past_due`; `refunded`, the late order ignored) while applying on
/// arrival ends on the delivery that landed last (`active`; `paid`).
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_paddle_and_lemonsqueezy_scenarios_end_right_where_applying_on_arrival_ends_wrong(
    pool: PgPool,
) {
    let stage = stage(pool).await;
    let room = stage.room().await;
    let mut finals = Vec::new();
    for (name, source) in [
        ("status-paddle", "paddle"),
        ("refund-lemonsqueezy", "lemonsqueezy"),
    ] {
        let run = room.start(name).unwrap();
        assert_eq!(
            (run.scenario, run.source.as_str(), run.steps),
            (name, source, 3)
        );
        let mut answers = Vec::new();
        for n in 1..=run.steps {
            answers.push(stage.step(&room, &run.run, n).await);
        }
        let outcomes: Vec<(&str, &str, Option<&str>)> = answers
            .iter()
            .map(|a| {
                let event = a.event.as_ref().expect("stored");
                (
                    a.answer.verdict.as_str(),
                    event.status,
                    event.outcome.as_deref(),
                )
            })
            .collect();
        let (applied, ignored) = (
            ("stored", "applied", Some("applied")),
            ("stored", "ignored", Some("ignored")),
        );
        assert_eq!(outcomes, [applied, applied, ignored], "{name}");
        for answer in &answers {
            let event = stage
                .app
                .event(answer.event.as_ref().unwrap().event_id)
                .await;
            assert_eq!(event.source, source);
            assert_eq!(event.customer_key.as_deref(), Some(run.customer.as_str()));
            assert!(answer.provider_time < chrono::Utc::now(), "{name}");
        }
        let last = answers.last().unwrap();
        finals.push(serde_json::to_value((&last.account, &last.on_arrival, &last.event)).unwrap());
    }
    let paddle = &finals[0];
    // trialing → past_due, with `active` landing last: past_due (the trial's grant kept).
    assert_eq!(
        (&paddle[0], &paddle[1]),
        (
            &json!({"plan": "free", "balance": 500, "status": "past_due"}),
            &json!({"plan": "free", "balance": 10, "status": "active"})
        )
    );
    assert!(
        paddle[2]["reason"]
            .as_str()
            .unwrap()
            .contains("is already stored"),
        "{paddle}"
    );
    let lemonsqueezy = &finals[1];
    // paid, refunded, a late paid: refunded, which is final (the paid grant is not taken back).
    assert_eq!(
        lemonsqueezy[0],
        json!({"plan": "free", "balance": 500, "status": "refunded"})
    );
    assert_eq!(
        lemonsqueezy[1],
        json!({"plan": "free", "balance": 10, "status": "paid"})
    );
    assert!(
        lemonsqueezy[2]["reason"]
            .as_str()
            .unwrap()
            .contains("is refunded, which is final"),
        "{lemonsqueezy}"
    );
}

/// `inboxctl scenario status-paddle` and `refund-lemonsqueezy` send the same scripts to the
/// development sources of those kinds, beside what applying on arrival shows.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn inboxctl_scenario_runs_the_paddle_and_lemonsqueezy_variants(pool: PgPool) {
    let url = database_url(&pool).await;
    let app = Arc::new(TestApp::spawn(pool).await);
    let intake = serve_intake(app.clone()).await;
    for (name, status, naive) in [
        (
            "status-paddle",
            "past_due",
            ["free/10/trialing", "free/10/past_due", "free/10/active"],
        ),
        (
            "refund-lemonsqueezy",
            "refunded",
            ["free/10/paid", "free/10/refunded", "free/10/paid"],
        ),
    ] {
        let stdout = scenario_cli(&app, &intake, &url, name, true).await;
        let report: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(report["final"]["status"], status, "{report}");
        assert_eq!(naive_columns(&report["timeline"]), naive, "{name}");
        let outcomes: Vec<&str> = report["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row["outcome"].as_str().unwrap_or("?"))
            .collect();
        assert_eq!(outcomes[..2], ["applied", "applied"], "{report}");
        assert!(outcomes[2].starts_with("ignored: "), "{report}");
    }
}

/// Status sent as Stripe thin events, on a Stripe source whose provider API is the fake Stripe
/// (docs/design.md §6.6, §12.5): each step has the fake hold the subscription as its change left
/// it and delivers the change's thin event, and the worker reads the object from the fake; each
/// read is stored and applied for its thin event, and the run ends where the snapshot events'
/// `status` ends (`past_due`, the late `active` read older than it).
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn the_status_scenario_as_thin_events_reads_each_change_from_the_fake_stripe(pool: PgPool) {
    let mut stage = stage(pool).await;
    let fake = provider_fakes::stripe::FakeStripe::default();
    let server = fake.serve().await;
    provider_fakes::hold::Hold::Stripe(fake.clone())
        .mount(&server)
        .await;
    let mut sources: Value = serde_json::from_str(&stage.sources).unwrap();
    for source in sources.as_array_mut().unwrap() {
        if source["kind"] == "stripe" {
            source["api_base_url"] = json!(server.uri());
        }
    }
    stage.sources = sources.to_string();
    crate::traffic::with_stripe_api(&mut stage.app.worker, &server);
    let room = stage.room().await;
    let run = room.start("status-thin").unwrap();
    assert_eq!(
        (run.scenario, run.source.as_str(), run.steps),
        ("status-thin", "stripe", 3)
    );
    let mut answers = Vec::new();
    for n in 1..=run.steps {
        answers.push(stage.step(&room, &run.run, n).await);
    }
    let outcomes: Vec<(&str, &str, Option<&str>)> = answers
        .iter()
        .map(|a| {
            let event = a.event.as_ref().expect("stored");
            (
                a.answer.verdict.as_str(),
                event.status,
                event.outcome.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("stored", "applied", Some("applied")),
            ("stored", "applied", Some("applied")),
            ("stored", "ignored", Some("ignored")),
        ]
    );
    // Each thin event's read, stored as an event of its own made for it (docs/design.md §6.2).
    let thin_ids: Vec<i64> = answers
        .iter()
        .map(|a| a.event.as_ref().unwrap().event_id)
        .collect();
    let read_for: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM inbox_events WHERE made_for = ANY($1) AND dedupe_key LIKE 'read:%'",
    )
    .bind(&thin_ids)
    .fetch_one(&stage.app.pool)
    .await
    .unwrap();
    assert_eq!(read_for, 3, "each thin event applied by its read");
    let reads: Vec<String> = server
        .received_requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.url.path().starts_with("/v1/subscriptions/"))
        .map(|r| r.url.path().to_owned())
        .collect();
    assert_eq!(reads.len(), 3, "one read a thin event: {reads:?}");
    let last = answers.last().unwrap();
    assert_eq!(
        serde_json::to_value((&last.account, &last.on_arrival)).unwrap(),
        json!([
            {"plan": "free", "balance": 500, "status": "past_due"},
            {"plan": "free", "balance": 10, "status": "active"}
        ])
    );
    for answer in &answers {
        let event = stage
            .app
            .event(answer.event.as_ref().unwrap().event_id)
            .await;
        assert_eq!(event.event_type, "v1.customer.subscription.updated");
    }
}
