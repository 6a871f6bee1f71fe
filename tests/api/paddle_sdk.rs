//! Paddle's own SDK checks our signatures (docs/design.md §6.4): paddle-python-sdk's
//! `Notifications.Verifier` (scripts/paddle-verify.py, the tool set `paddle-sdk`) verifies
//! deliveries signed now by our signer, refuses a tampered body and a wrong secret, and our
//! verifier says the same of every one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use http::HeaderMap;
use serde_json::Value;
use shared::domain::SourceKind;
use shared::platform::config::SourceConfig;
use shared::providers::fixtures::{self, Local, Spec};
use shared::providers::paddle::fixtures::{signature, DEV_SECRET};
use shared::providers::paddle::{PaddleVerifier, SIGNATURE_HEADER};
use shared::providers::CheckNow;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The python of the `paddle-sdk` tool set, installed on first use. A machine that cannot
/// install it fails this test: it is never skipped.
fn sdk_python() -> PathBuf {
    let output = Command::new("bash")
        .args(["-c", "source scripts/tools.sh && tools_bin paddle-sdk"])
        .current_dir(ROOT)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "the paddle-sdk tool set (scripts/tools/paddle-sdk.txt) did not install: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let bin = String::from_utf8(output.stdout).unwrap();
    Path::new(bin.trim()).join("python")
}

/// What Paddle's SDK says of `body` under `header` with `secrets`: `Some(true)` valid,
/// `Some(false)` refused, `None` refused as stale (signed more than its 5 s before it ran);
/// anything else (the script failing) fails the test.
fn sdk_says(python: &Path, body: &[u8], header: &str, secrets: &[&str]) -> Option<bool> {
    let mut command = Command::new(python);
    command
        .arg(Path::new(ROOT).join("scripts/paddle-verify.py"))
        .args(["--header", header])
        .env_remove("TEST_MODE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for secret in secrets {
        command.args(["--secret", secret]);
    }
    let mut child = command.spawn().unwrap();
    child.stdin.take().unwrap().write_all(body).unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    match (output.status.code(), stdout.trim()) {
        (Some(0), "valid") => Some(true),
        (Some(1), "invalid") => Some(false),
        (Some(3), "stale") => None,
        (code, _) => panic!(
            "paddle-verify.py: exit {code:?}, {stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

/// What our verifier says, with the source's default tolerance.
fn ours_says(body: &[u8], header: &str, secrets: &[&str]) -> bool {
    let verifier = PaddleVerifier::new(
        secrets.iter().map(|s| s.as_bytes().to_vec()).collect(),
        Duration::from_secs(300),
    );
    let mut headers = HeaderMap::new();
    headers.insert(SIGNATURE_HEADER, header.parse().unwrap());
    verifier.check(&headers, body, Utc::now()).is_ok()
}

/// Both verdicts on `body` under the header `sign` makes now, which must agree, and the one
/// they agree on. A header the SDK found stale (this machine slow to start it) is signed again.
fn verdict(
    python: &Path,
    case: &str,
    body: &[u8],
    sign: impl Fn() -> String,
    secrets: &[&str],
) -> bool {
    for _ in 0..5 {
        let header = sign();
        let Some(sdk) = sdk_says(python, body, &header, secrets) else {
            continue;
        };
        let ours = ours_says(body, &header, secrets);
        assert_eq!(sdk, ours, "{case}: Paddle's SDK says {sdk}, ours {ours}");
        return sdk;
    }
    panic!("{case}: Paddle's SDK found the header stale five times")
}

/// The corpus file as it is on disk, byte for byte.
fn corpus_body(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(ROOT).join(format!("testdata/providers/paddle/{name}.json"))).unwrap()
}

/// The hex of a header's (only) `h1`.
fn h1(header: &str) -> &str {
    header.split_once(";h1=").unwrap().1
}

#[test]
fn paddles_sdk_verifies_our_signatures_and_refuses_what_ours_refuses() {
    let python = sdk_python();
    let now = || Utc::now().timestamp();
    let signed = |secret: &'static str, body: &[u8]| {
        let body = body.to_vec();
        move || signature(secret.as_bytes(), now(), &body)
    };

    // Corpus deliveries, signed now with the development destination's secret.
    for name in [
        "subscription.created",
        "subscription.trialing",
        "subscription.canceled",
        "transaction.completed",
        "transaction.payment_failed",
        "adjustment.updated",
    ] {
        let body = corpus_body(name);
        let header = signed(DEV_SECRET, &body);
        assert!(verdict(&python, name, &body, &header, &[DEV_SECRET]));

        let mut tampered = body.clone();
        let at = tampered.iter().position(|&b| b == b':').unwrap() + 1;
        tampered.insert(at, b' ');
        assert!(!verdict(
            &python,
            &format!("{name}, a space added to the body"),
            &tampered,
            &header,
            &[DEV_SECRET]
        ));
        assert!(!verdict(
            &python,
            &format!("{name}, another secret"),
            &body,
            &header,
            &["pdl_ntfset_01other"]
        ));
    }

    // A destination's secret rotating: one h1 per secret in the header; either secret alone,
    // or both, verifies; a third does not.
    let (old, new) = ("pdl_ntfset_01rotating_old", "pdl_ntfset_01rotating_new");
    let body = corpus_body("subscription.updated");
    let rotated = || {
        let ts = now();
        format!(
            "{};h1={}",
            signature(new.as_bytes(), ts, &body),
            h1(&signature(old.as_bytes(), ts, &body))
        )
    };
    for secrets in [&[old][..], &[new], &[new, old], &[old, new]] {
        assert!(verdict(
            &python,
            &format!("rotation, secrets {secrets:?}"),
            &body,
            rotated,
            secrets
        ));
    }
    assert!(!verdict(
        &python,
        "rotation, a third secret",
        &body,
        rotated,
        &["pdl_ntfset_01third"]
    ));
    let mut tampered = body.clone();
    tampered.pop();
    assert!(!verdict(
        &python,
        "rotation, the body cut",
        &tampered,
        rotated,
        &[new, old]
    ));

    // The delivery the development source, `inboxctl send` and the Engine Room send: the
    // fixtures' payload, signed by the fixtures' signer.
    let source: SourceConfig = serde_json::from_value(
        fixtures::dev_sources(&Local { jwks_url: "" })
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["kind"] == SourceKind::Paddle.as_str())
            .cloned()
            .unwrap(),
    )
    .unwrap();
    for kind in fixtures::kinds(SourceKind::Paddle) {
        let spec = Spec {
            kind: (*kind).into(),
            customer: "ctm_01sdkcheck".into(),
            at: Utc::now(),
            ..Default::default()
        };
        let (id, payload): (String, Value) = fixtures::payload(SourceKind::Paddle, &spec).unwrap();
        let sign = || fixtures::sign_delivery(&source, &id, &payload, None).unwrap();
        let header = || {
            sign()
                .headers
                .into_iter()
                .find(|(name, _)| name == SIGNATURE_HEADER)
                .map(|(_, value)| value)
                .unwrap()
        };
        assert!(verdict(
            &python,
            &format!("the fixtures' {kind}"),
            &sign().body,
            header,
            &[DEV_SECRET]
        ));
    }
}
