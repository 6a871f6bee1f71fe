//! `inboxctl fakes`: the provider fakes the tests use (docs/design.md §6.6), served on loopback
//! for the dev stack, one port per provider so that a source's `api_base_url` points at its
//! provider's as it would at the real API: Stripe on the first port, then Polar, Kinde, Paddle
//! and Lemon Squeezy. Each keeps its provider's documented rate limit, and every request is
//! checked against the provider's published description; a request the provider would refuse is
//! said on stderr, as a test fails on it.
//!
//! What a fake holds comes from the same fixtures the deliveries are built from: whoever sends a
//! delivery whose object the worker will read (`inboxctl send --thin`) first tells the fake to
//! hold that object, `POST {api_base_url}/_fake/objects` with the object as its body. That
//! route is the fake's own, not the provider's, and is not checked.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use provider_fakes::hold::{Hold, HOLD};
use provider_fakes::stripe::FakeStripe;
use provider_fakes::{
    FakeKinde, FakeLemonSqueezy, FakePaddle, FakePolar, ProviderServer, KINDE, LEMONSQUEEZY,
    PADDLE, POLAR, STRIPE,
};
use serde_json::{json, Value};
use shared::domain::SourceKind;

/// The first of the fakes' five ports (scripts/stack.sh: INBOX_FAKES_PORT).
pub const DEFAULT_PORT: u16 = 61340;

/// The Kinde M2M application the dev Kinde source calls the fake with (dev-only values).
const KINDE_CLIENT_ID: &str = "dev_fakes_m2m";
const KINDE_CLIENT_SECRET: &str = "dev_fakes_m2m_secret_local_only";

/// Each provider the fakes serve: its source kind, its port after the first, and the test-mode
/// API key a dev source calls it with (Stripe's `sk_test_` prefix puts the fake in its sandbox
/// limits, docs.stripe.com/keys).
const SERVED: [(SourceKind, u16, &str); 5] = [
    (SourceKind::Stripe, 0, "sk_test_dev_fakes_local_only"),
    (
        SourceKind::StandardWebhooks,
        1,
        "polar_oat_dev_fakes_local_only",
    ),
    (SourceKind::Kinde, 2, KINDE_CLIENT_SECRET),
    (
        SourceKind::Paddle,
        3,
        "pdl_sdbx_apikey_dev_fakes_local_only",
    ),
    (SourceKind::LemonSqueezy, 4, "dev_fakes_local_only"),
];

#[derive(Args)]
pub struct FakesArgs {
    /// The first port (127.0.0.1): Stripe there, then Polar, Kinde, Paddle and Lemon Squeezy
    /// on the next four.
    #[arg(long, env = "INBOX_FAKES_PORT", default_value_t = DEFAULT_PORT)]
    pub port: u16,
}

/// The meter a dev source reports its debits to on the fakes (docs/design.md §4.13): the fake
/// Stripe account's `api_calls` meter (`provider_fakes::stripe`), and the same event name at
/// the fake Polar's ingestion, which takes any.
const DEV_METER: &str = "api_calls";

/// The dev sources in `sources` (`inboxctl dev sources`), each pointed at its provider's fake
/// on the ports from `port`, with the test-mode key the fake takes; Stripe's and Polar's
/// metered, so that a debit in the dev stack (`inboxctl usage`, the API) writes a report the
/// dispatcher sends to the fake's meter.
pub fn point_at(sources: &mut Value, port: u16) {
    let Some(list) = sources.as_array_mut() else {
        return;
    };
    for source in list {
        let kind = source["kind"].as_str();
        let Some((kind, offset, key)) = SERVED.iter().find(|(k, _, _)| Some(k.as_str()) == kind)
        else {
            continue;
        };
        source["api_base_url"] = json!(format!("http://127.0.0.1:{}", port + offset));
        source["api_key"] = json!(key);
        if *kind == SourceKind::Kinde {
            source["api_client_id"] = json!(KINDE_CLIENT_ID);
        }
        if matches!(kind, SourceKind::Stripe | SourceKind::StandardWebhooks) {
            source["meter"] = json!({ "event_name": DEV_METER });
        }
    }
}

pub async fn run(args: &FakesArgs) -> anyhow::Result<()> {
    let listen = |offset: u16| {
        let addr = SocketAddr::from(([127, 0, 0, 1], args.port + offset));
        TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))
    };
    let stripe = FakeStripe::default();
    let polar = FakePolar::sandbox();
    let kinde = FakeKinde::new(KINDE_CLIENT_ID, KINDE_CLIENT_SECRET);
    let paddle = FakePaddle::default();
    let lemonsqueezy = FakeLemonSqueezy::default();

    let servers = [
        (
            "Stripe",
            ProviderServer::listening(&STRIPE, listen(0)?).await,
        ),
        ("Polar", ProviderServer::listening(&POLAR, listen(1)?).await),
        ("Kinde", ProviderServer::listening(&KINDE, listen(2)?).await),
        (
            "Paddle",
            ProviderServer::listening(&PADDLE, listen(3)?).await,
        ),
        (
            "Lemon Squeezy",
            ProviderServer::listening(&LEMONSQUEEZY, listen(4)?).await,
        ),
    ];
    stripe.mount(&servers[0].1).await;
    polar.mount(&servers[1].1).await;
    kinde.mount(&servers[2].1).await;
    paddle.mount(&servers[3].1).await;
    lemonsqueezy.mount(&servers[4].1).await;
    let holds = [
        Hold::Stripe(stripe),
        Hold::Polar(polar),
        Hold::Kinde(kinde),
        Hold::Paddle(paddle),
        Hold::LemonSqueezy(lemonsqueezy),
    ];
    for ((_, server), hold) in servers.iter().zip(holds) {
        hold.mount(server).await;
    }
    for (name, server) in &servers {
        eprintln!("fakes: {name} at {}", server.uri());
    }
    let mut every = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        for (name, server) in &servers {
            for refused in server.take_refused() {
                eprintln!("fakes: {name} would refuse {refused}");
            }
        }
    }
}

/// Tells the fake at `api_base_url` to hold `object` (docs/design.md §6.6).
pub async fn hold(
    http: &reqwest::Client,
    api_base_url: &str,
    object: &Value,
) -> anyhow::Result<()> {
    let url = format!("{}{HOLD}", api_base_url.trim_end_matches('/'));
    let answer = http.post(&url).json(object).send().await.with_context(|| {
        format!("telling the fake at {url} to hold the object (is `inboxctl fakes` running?)")
    })?;
    anyhow::ensure!(
        answer.status().is_success(),
        "the fake at {url} answered {}",
        answer.status()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dev_source_points_at_its_providers_fake_with_a_test_mode_key() {
        let mut sources = json!([
            {"name": "stripe", "kind": "stripe"},
            {"name": "polar", "kind": "standard-webhooks"},
            {"name": "kinde", "kind": "kinde"},
            {"name": "paddle", "kind": "paddle"},
            {"name": "lemonsqueezy", "kind": "lemonsqueezy"},
        ]);
        point_at(&mut sources, 61340);
        let urls: Vec<&str> = sources
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["api_base_url"].as_str().unwrap())
            .collect();
        assert_eq!(
            urls,
            [
                "http://127.0.0.1:61340",
                "http://127.0.0.1:61341",
                "http://127.0.0.1:61342",
                "http://127.0.0.1:61343",
                "http://127.0.0.1:61344",
            ]
        );
        assert!(sources[0]["api_key"]
            .as_str()
            .unwrap()
            .starts_with("sk_test_"));
        assert_eq!(sources[2]["api_client_id"], KINDE_CLIENT_ID);
        assert_eq!(sources[0]["meter"], json!({"event_name": "api_calls"}));
        assert_eq!(sources[1]["meter"], json!({"event_name": "api_calls"}));
    }
}
