use super::*;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::domain::SourceKind;
use crate::signing::standard_webhooks::SecretEncoding;

fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

fn database(vars: &[(&str, &str)]) -> Result<DatabaseConfig, ConfigError> {
    DatabaseConfig::read(lookup(vars))
}

#[test]
fn the_secret_or_the_url_exactly_one() {
    assert_eq!(
        database(&[(
            DATABASE_SECRET_VAR,
            "arn:aws:secretsmanager:eu-west-1:1:secret:db"
        )])
        .unwrap()
        .source,
        DatabaseSource::Secret("arn:aws:secretsmanager:eu-west-1:1:secret:db".into())
    );
    assert!(matches!(
        database(&[(DATABASE_URL_VAR, "postgres://u:p@h/d")])
            .unwrap()
            .source,
        DatabaseSource::Url(_)
    ));
    let both = database(&[
        (DATABASE_SECRET_VAR, "db"),
        (DATABASE_URL_VAR, "postgres://u:p@h/d"),
    ])
    .unwrap_err();
    assert_eq!(both.var, DATABASE_SECRET_VAR);
    assert_eq!(
        database(&[]).unwrap_err().to_string(),
        "DATABASE_SECRET_ID: is not set (nor DATABASE_URL): name the database's secret"
    );
}

#[test]
fn the_pooler_is_none_unless_named() {
    let url = (DATABASE_URL_VAR, "postgres://u:p@h/d");
    assert_eq!(database(&[url]).unwrap().pooler, Pooler::None);
    assert_eq!(
        database(&[url, (DATABASE_POOLER_VAR, "none")])
            .unwrap()
            .pooler,
        Pooler::None
    );
    assert_eq!(
        database(&[url, (DATABASE_POOLER_VAR, " transaction ")])
            .unwrap()
            .pooler,
        Pooler::Transaction
    );
    assert_eq!(
        database(&[url, (DATABASE_POOLER_VAR, "session")]).unwrap_err().to_string(),
        "DATABASE_POOLER: 'session' is neither 'none' nor 'transaction' (RDS Proxy is 'transaction')"
    );
}

#[test]
fn a_relative_ca_file_is_in_the_package() {
    let c = database(&[
        (DATABASE_SECRET_VAR, "db"),
        (DATABASE_CA_VAR, "certs/global-bundle.pem"),
        ("LAMBDA_TASK_ROOT", "/var/task"),
    ])
    .unwrap();
    assert_eq!(
        c.ca_file.as_deref(),
        Some(Path::new("/var/task/certs/global-bundle.pem"))
    );
}

#[test]
fn a_secret_is_verified_in_full_unless_told_otherwise_and_a_url_keeps_its_own() {
    let secret = (
        DATABASE_SECRET_VAR,
        "arn:aws:secretsmanager:eu-west-1:1:secret:rds!db-1-AbCdEf",
    );
    let url = (
        DATABASE_URL_VAR,
        "postgres://postgres@127.0.0.1:61320/postgres",
    );
    let ca = (DATABASE_CA_VAR, "/opt/global-bundle.pem");
    let mode = |vars: &[(&str, &str)]| database(vars).unwrap().tls_mode();
    assert_eq!(mode(&[secret]), Some(Tls::VerifyFull));
    assert_eq!(mode(&[secret, ca]), Some(Tls::VerifyFull));
    // Local use and tests: what the URL says (sqlx's prefer when it says nothing).
    assert_eq!(mode(&[url]), None);
    assert_eq!(mode(&[url, ca]), Some(Tls::VerifyFull));
    for (value, tls) in [
        ("verify-full", Tls::VerifyFull),
        ("verify-ca", Tls::VerifyCa),
        ("require", Tls::Require),
        ("prefer", Tls::Prefer),
        (" disable ", Tls::Disable),
    ] {
        assert_eq!(mode(&[secret, (DATABASE_TLS_VAR, value)]), Some(tls));
        assert_eq!(mode(&[url, (DATABASE_TLS_VAR, value)]), Some(tls));
    }
    assert_eq!(
        mode(&[secret, ca, (DATABASE_TLS_VAR, "verify-ca")]),
        Some(Tls::VerifyCa)
    );
}

#[test]
fn a_tls_setting_that_cannot_work_is_refused_by_name() {
    let secret = (DATABASE_SECRET_VAR, "db");
    assert_eq!(
        database(&[secret, (DATABASE_TLS_VAR, "verify")])
            .unwrap_err()
            .to_string(),
        "DATABASE_TLS: 'verify' is not one of verify-full, verify-ca, require, prefer, disable"
    );
    assert_eq!(
        database(&[
            secret,
            (DATABASE_TLS_VAR, "require"),
            (DATABASE_CA_VAR, "/opt/global-bundle.pem")
        ])
        .unwrap_err()
        .to_string(),
        "DATABASE_CA_FILE: names a CA bundle ('/opt/global-bundle.pem'), but DATABASE_TLS \
         'require' checks no certificate: set DATABASE_TLS to verify-full (or verify-ca), \
         or leave DATABASE_CA_FILE unset"
    );
}

#[test]
fn the_source_never_shows_its_url() {
    let shown = format!("{:?}", DatabaseConfig::url("postgres://u:hunter2@h/d"));
    assert!(!shown.contains("hunter2"), "{shown}");
}

const SOURCES: &str = r#"[{"name":"app","kind":"standard-webhooks","secrets":["whsec_x"]},
    {"name":"shop","kind":"standard-webhooks","secrets":["p"],"secret_encoding":"raw","tolerance_secs":60},
    {"name":"store","kind":"standard-webhooks","secrets":["whsec_y"]}]"#;

#[test]
fn full_config_parses() {
    let c = IntakeConfig::from_lookup(lookup(&[
        ("DATABASE_URL", "postgres://x"),
        ("QUEUE_URL", "http://q"),
        ("INBOX_SOURCES", SOURCES),
    ]))
    .unwrap();
    assert_eq!(c.sources.len(), 3);
    assert_eq!(c.sources[1].kind, SourceKind::StandardWebhooks);
    assert_eq!(c.sources[1].secret_encoding, Some(SecretEncoding::Raw));
    assert_eq!(c.tolerance, Duration::from_secs(300));
}

#[test]
fn missing_variable_is_named() {
    let err = IntakeConfig::from_lookup(lookup(&[("DATABASE_URL", "postgres://x")])).unwrap_err();
    assert_eq!(err.to_string(), "QUEUE_URL: is not set");
}

#[test]
fn malformed_sources_are_named() {
    let err = IntakeConfig::from_lookup(lookup(&[
        ("DATABASE_URL", "postgres://x"),
        ("QUEUE_URL", "http://q"),
        ("INBOX_SOURCES", r#"[{"name":"s","kind":"paypal"}]"#),
    ]))
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("INBOX_SOURCES: not a valid list"),
        "{err}"
    );
    assert!(parse_sources(r#"[{"name":"a/b","kind":"standard-webhooks"}]"#).is_err());
    assert!(parse_sources("[]").is_err());
    assert!(
        parse_sources(r#"[{"name":"s","kind":"standard-webhooks","secret":["typo"]}]"#).is_err()
    );
}

#[test]
fn debug_output_redacts_secrets() {
    let sources = parse_sources(
        r#"[{"name":"s","kind":"standard-webhooks","secrets":["whsec_topsecret"],"api_key":"key_topsecret"}]"#,
    )
    .unwrap();
    let shown = format!("{sources:?}");
    assert!(!shown.contains("topsecret"), "{shown}");
}

#[test]
fn tolerance_must_be_positive() {
    let base = [
        ("DATABASE_URL", "postgres://x"),
        ("QUEUE_URL", "http://q"),
        ("INBOX_SOURCES", SOURCES),
    ];
    let mut vars = base.to_vec();
    vars.push(("INBOX_TOLERANCE_SECS", "0"));
    assert!(IntakeConfig::from_lookup(lookup(&vars)).is_err());
    vars.pop();
    vars.push(("INBOX_TOLERANCE_SECS", "120"));
    assert_eq!(
        IntakeConfig::from_lookup(lookup(&vars)).unwrap().tolerance,
        Duration::from_secs(120)
    );
}

#[test]
fn errors_name_the_variable_and_the_field() {
    let twice = parse_sources(
        r#"[{"name":"s","kind":"standard-webhooks","secrets":["a"]},{"name":"s","kind":"standard-webhooks","secrets":["b"]}]"#,
    )
    .unwrap_err();
    assert_eq!(
        twice.to_string(),
        "INBOX_SOURCES: source 's': is configured twice"
    );
    let bad_name = parse_sources(r#"[{"name":"a/b","kind":"standard-webhooks"}]"#).unwrap_err();
    assert_eq!(bad_name.field.as_deref(), Some("[0].name"));
    let plans = parse_plans(r#"{"gold":{"plan":"gold","monthly_allowance":-5}}"#).unwrap_err();
    assert_eq!(plans.var, PLANS_VAR);
    assert_eq!(plans.field.as_deref(), Some("gold"));
}

#[test]
fn the_api_key_has_a_secret_of_its_own_and_one_place() {
    let split = parse_sources(
        r#"[{"name":"s","kind":"standard-webhooks","secret_id":"billing-inbox/s","api_key_secret_id":"billing-inbox/s-api-key"},
            {"name":"k","kind":"standard-webhooks","secret_id":"billing-inbox/k","api_key_secret_id":"billing-inbox/k-api-key"}]"#,
    )
    .unwrap();
    assert_eq!(
        split[0].api_key_secret_id.as_deref(),
        Some("billing-inbox/s-api-key")
    );
    let cases = [
        (
            r#"[{"name":"s","kind":"standard-webhooks","secret_id":"a","api_key":"sk_inline_value","api_key_secret_id":"b"}]"#,
            "INBOX_SOURCES: source 's': api_key: is given inline and in api_key_secret_id: the API key must be in one place (deployed: its secret; remove the inline api_key)",
        ),
        (
            r#"[{"name":"s","kind":"standard-webhooks","secret_id":"same","api_key_secret_id":"same"}]"#,
            r#"INBOX_SOURCES: source 's': api_key_secret_id: names the secret_id secret: the API key needs a secret of its own, {"api_key": "..."}, so that the intake may not read it"#,
        ),
        (
            r#"[{"name":"s","kind":"standard-webhooks","secret_id":"a","api_key_secret_id":" "}]"#,
            "INBOX_SOURCES: source 's': api_key_secret_id: is empty: name a Secrets Manager secret (ARN or name), or leave the field out",
        ),
        (
            r#"[{"name":"s","kind":"standard-webhooks","secret_id":""}]"#,
            "INBOX_SOURCES: source 's': secret_id: is empty: name a Secrets Manager secret (ARN or name), or leave the field out",
        ),
    ];
    for (raw, expected) in cases {
        let error = parse_sources(raw).unwrap_err().to_string();
        assert_eq!(error, expected, "{raw}");
        assert!(!error.contains("sk_inline_value"), "{error}");
    }
    let shown = format!("{:?}", split[0]);
    assert!(
        shown.contains(r#"api_key_secret_id: Some("billing-inbox/s-api-key")"#),
        "{shown}"
    );
}

#[test]
fn worker_and_scheduler_read_their_variables() {
    let base = [
        ("DATABASE_URL", "postgres://x"),
        ("QUEUE_URL", "http://q"),
        ("INBOX_SOURCES", SOURCES),
    ];
    let missing = WorkerConfig::from_lookup(lookup(&base)).unwrap_err();
    assert_eq!(missing.to_string(), "INBOX_PLANS: is not set");
    // The scheduler's audit folds accounts with the catalog, as the worker applies them.
    let missing = SchedulerConfig::from_lookup(lookup(&base)).unwrap_err();
    assert_eq!(missing.to_string(), "INBOX_PLANS: is not set");
    let mut vars = base.to_vec();
    vars.push((
        PLANS_VAR,
        r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
    ));
    let worker = WorkerConfig::from_lookup(lookup(&vars)).unwrap();
    assert!(worker
        .sources
        .iter()
        .any(|s| s.name == "shop" && s.kind == SourceKind::StandardWebhooks));
    // The queue the reads it stores go to; without it the rescue sends them.
    assert_eq!(worker.queue_url.as_deref(), Some("http://q"));
    let without: Vec<_> = vars
        .iter()
        .filter(|v| v.0 != "QUEUE_URL")
        .cloned()
        .collect();
    let worker = WorkerConfig::from_lookup(lookup(&without)).unwrap();
    assert_eq!(worker.queue_url, None);
    let scheduler = SchedulerConfig::from_lookup(lookup(&vars)).unwrap();
    assert_eq!(scheduler.retention, Duration::from_secs(30 * 86_400));
    vars.push(("INBOX_RETENTION_DAYS", "2"));
    let short = SchedulerConfig::from_lookup(lookup(&vars)).unwrap_err();
    assert_eq!(short.var, "INBOX_RETENTION_DAYS");
}

#[test]
fn a_worker_without_provider_reads_keeps_no_api_key_nor_its_secret() {
    let sources = r#"[{"name":"app","kind":"standard-webhooks","secret_id":"billing-inbox/app","api_key_secret_id":"billing-inbox/app-api-key"},
        {"name":"shop","kind":"standard-webhooks","secrets":["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"],"api_key":"oat_x"}]"#;
    let vars = |reads: &'static str| {
        vec![
            ("DATABASE_URL", "postgres://x"),
            ("INBOX_SOURCES", sources),
            (
                PLANS_VAR,
                r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
            ),
            (PROVIDER_READS_VAR, reads),
        ]
    };
    let keys = |reads| {
        WorkerConfig::from_lookup(lookup(&vars(reads)))
            .unwrap()
            .sources_read()
            .iter()
            .map(|s| {
                (
                    s.api_key.is_some(),
                    s.api_key_secret_id.is_some(),
                    s.secret_id.is_some(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        keys("false"),
        [(false, false, false), (false, false, false)]
    );
    assert_eq!(keys("true"), [(false, true, true), (true, false, false)]);
    assert_eq!(keys(""), keys("true"), "unset: provider reads on");
    assert_eq!(
        WorkerConfig::from_lookup(lookup(&vars("no")))
            .unwrap_err()
            .to_string(),
        "INBOX_PROVIDER_READS: 'no' is neither 'true' nor 'false'"
    );
}

const SINKS: &str = r#"[{"name":"app","kind":"webhook","url":"https://app.example/billing-events","secret":"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
    {"name":"bus","kind":"eventbridge","bus":"billing"}]"#;

fn worker_vars(effects: &str) -> Vec<(&str, &str)> {
    vec![
        ("DATABASE_URL", "postgres://x"),
        ("INBOX_SOURCES", SOURCES),
        (
            "INBOX_PLANS",
            r#"{"pro":{"plan":"pro","monthly_allowance":5}}"#,
        ),
        ("INBOX_EFFECTS", effects),
    ]
}

#[test]
fn effects_are_off_unless_inbox_effects_is_set() {
    let mut vars = worker_vars(SINKS);
    vars.pop();
    assert!(WorkerConfig::from_lookup(lookup(&vars))
        .unwrap()
        .effects
        .is_none());
}

#[test]
fn effect_sinks_parse_and_need_their_queue() {
    let missing = WorkerConfig::from_lookup(lookup(&worker_vars(SINKS))).unwrap_err();
    assert_eq!(missing.to_string(), "EFFECTS_QUEUE_URL: is not set");
    let mut vars = worker_vars(SINKS);
    vars.push(("EFFECTS_QUEUE_URL", "http://q/effects"));
    let effects = WorkerConfig::from_lookup(lookup(&vars))
        .unwrap()
        .effects
        .unwrap();
    assert_eq!(effects.queue_url, "http://q/effects");
    assert_eq!(effects.sinks[0].kind, SinkKind::Webhook);
    assert_eq!(effects.sinks[1].bus.as_deref(), Some("billing"));
    let shown = format!("{:?}", effects.sinks[0]);
    assert!(!shown.contains("whsec_"), "{shown}");
}

#[test]
fn malformed_sinks_are_named() {
    let cases = [
        ("[]", "INBOX_EFFECTS: lists no sink (leave it unset to write no effects)"),
        (
            r#"[{"name":"app","kind":"webhook","url":"https://a.example/e"}]"#,
            "INBOX_EFFECTS: sink 'app': secret: a webhook sink takes exactly one of secret (whsec_<base64>) or secret_id",
        ),
        (
            r#"[{"name":"app","kind":"webhook","url":"https://a.example/e","secret":"whsec_AAAA","secret_id":"s"}]"#,
            "INBOX_EFFECTS: sink 'app': secret: a webhook sink takes exactly one of secret (whsec_<base64>) or secret_id",
        ),
        (
            r#"[{"name":"app","kind":"webhook","url":"ftp://a.example/e","secret":"whsec_AAAA"}]"#,
            "INBOX_EFFECTS: sink 'app': url: must be an http(s) URL with a host",
        ),
        (
            r#"[{"name":"app","kind":"webhook","url":"https://a.example/e","secret":"whsec_!!"}]"#,
            "INBOX_EFFECTS: sink 'app': secret: must be whsec_ followed by base64 (of the signing key)",
        ),
        (
            r#"[{"name":"bus","kind":"eventbridge"}]"#,
            "INBOX_EFFECTS: sink 'bus': bus: is required",
        ),
        (
            r#"[{"name":"bus","kind":"eventbridge","bus":"b","url":"https://a.example"}]"#,
            "INBOX_EFFECTS: sink 'bus': url: url, secret and secret_id are webhook settings",
        ),
        (
            r#"[{"name":"b","kind":"eventbridge","bus":"x"},{"name":"b","kind":"eventbridge","bus":"y"}]"#,
            "INBOX_EFFECTS: sink 'b': name: is configured twice",
        ),
        (
            r#"[{"name":"b","kind":"sns"}]"#,
            "INBOX_EFFECTS: not a valid list of sinks: a value has the wrong type (line 1, column 25)",
        ),
    ];
    for (raw, expected) in cases {
        assert_eq!(parse_sinks(raw).unwrap_err().to_string(), expected, "{raw}");
    }
}

const API_KEYS: &str = r#"[{"name":"ops","sha256":"0000000000000000000000000000000000000000000000000000000000000000","scopes":["admin"]}]"#;

/// The app API's variables, with `INBOX_ENGINE_ROOM` and `QUEUE_URL` as given.
fn api_config(engine_room: Option<&str>, queue: bool) -> Result<ApiConfig, ConfigError> {
    let sources = r#"[{"name":"shop","kind":"standard-webhooks","secrets":["shop_secret"],"secret_encoding":"raw"}]"#;
    let mut vars = vec![
        ("DATABASE_URL", "postgres://x"),
        ("INBOX_SOURCES", sources),
        (
            "INBOX_PLANS",
            r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
        ),
        ("INBOX_API_KEYS", API_KEYS),
    ];
    if let Some(raw) = engine_room {
        vars.push(("INBOX_ENGINE_ROOM", raw));
    }
    if queue {
        vars.push(("QUEUE_URL", "http://127.0.0.1:9/queue/q"));
    }
    ApiConfig::from_lookup(lookup(&vars))
}

/// With meter reports off (the stack's `MeterReports`), a source with a meter stops the
/// api's cold start, naming the source; on, or unset, it starts.
#[test]
fn a_metered_source_with_meter_reports_off_is_refused_at_cold_start() {
    let with = |reports: Option<&'static str>| {
        let mut vars = vec![
            ("DATABASE_URL", "postgres://x"),
            (
                "INBOX_SOURCES",
                r#"[{"name":"shop","kind":"standard-webhooks","secrets":["whsec_test"],"api_key":"key_1","meter":{"event_name":"api_calls"}}]"#,
            ),
            (
                "INBOX_PLANS",
                r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
            ),
            ("INBOX_API_KEYS", API_KEYS),
        ];
        if let Some(reports) = reports {
            vars.push((METER_REPORTS_VAR, reports));
        }
        ApiConfig::from_lookup(lookup(&vars))
    };
    let refused = with(Some("off")).unwrap_err();
    assert_eq!(refused.var, METER_REPORTS_VAR);
    assert!(refused.detail.contains("'shop'"), "{}", refused.detail);
    assert!(with(Some("on")).is_ok());
    assert!(with(None).is_ok());
    assert_eq!(with(Some("maybe")).unwrap_err().var, METER_REPORTS_VAR);
}

#[test]
fn the_consoles_base_and_the_silence_hours_are_checked_and_default_to_none_and_a_day() {
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut vars = vec![
            ("DATABASE_URL", "postgres://x"),
            (
                "INBOX_SOURCES",
                r#"[{"name":"shop","kind":"standard-webhooks","secrets":["whsec_test"]}]"#,
            ),
            (
                "INBOX_PLANS",
                r#"{"pro":{"plan":"pro","monthly_allowance":500}}"#,
            ),
            ("INBOX_API_KEYS", API_KEYS),
        ];
        vars.extend_from_slice(extra);
        ApiConfig::from_lookup(lookup(&vars))
    };
    let plain = with(&[]).unwrap();
    assert_eq!(
        (
            plain.console_base.as_str(),
            plain.source_silent_hours,
            plain.queue_url
        ),
        ("", 24.0, None)
    );
    let set = with(&[
        (CONSOLE_BASE_VAR, "/lambda-url/api"),
        (SILENT_HOURS_VAR, "6"),
        ("QUEUE_URL", "http://q"),
    ])
    .unwrap();
    assert_eq!(
        (set.console_base.as_str(), set.source_silent_hours),
        ("/lambda-url/api", 6.0)
    );
    assert_eq!(set.queue_url.as_deref(), Some("http://q"));
    for bad in ["lambda-url/api", "/api/", "/a b", "/a\"<"] {
        assert_eq!(
            with(&[(CONSOLE_BASE_VAR, bad)]).unwrap_err().var,
            CONSOLE_BASE_VAR,
            "{bad:?}"
        );
    }
    for bad in ["0", "-1", "soon", "NaN"] {
        assert_eq!(
            with(&[(SILENT_HOURS_VAR, bad)]).unwrap_err().var,
            SILENT_HOURS_VAR,
            "{bad:?}"
        );
    }
}

#[test]
fn the_engine_room_is_off_unless_set_and_needs_the_intakes_queue() {
    let off = api_config(None, true).unwrap();
    assert!(off.engine_room.is_none());

    let settings = r#"{"sources":["shop"]}"#;
    let room = api_config(Some(settings), true)
        .unwrap()
        .engine_room
        .unwrap();
    assert_eq!(room.settings, settings);
    assert_eq!(room.queue_url, "http://127.0.0.1:9/queue/q");
    assert_eq!(room.tolerance, Duration::from_secs(DEFAULT_TOLERANCE_SECS));

    assert_eq!(
        api_config(Some(settings), false).unwrap_err().to_string(),
        "QUEUE_URL: is not set: the Engine Room (INBOX_ENGINE_ROOM) hands its events to the intake's queue"
    );
}
