//! `inboxctl dev`: the event source mapping and the schedule, for the local stack.

use std::time::Duration;

use anyhow::Context;
use clap::Args;

use inbox::bridge;

#[derive(Args)]
pub struct DevArgs {
    /// Where `cargo lambda watch` serves the Lambda Invoke API.
    #[arg(
        long,
        env = "INBOX_INVOKE_URL",
        default_value = "http://127.0.0.1:9000"
    )]
    pub invoke_url: String,
    /// The queue the intake sends to.
    #[arg(long, env = "QUEUE_URL")]
    pub queue_url: String,
    /// Seconds between scheduler runs (0: never).
    #[arg(long, default_value_t = 60)]
    pub tick_secs: u64,
}

pub async fn run(args: &DevArgs) -> anyhow::Result<()> {
    // Long polls outlast the short timeouts the functions use.
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&inbox::queue::sdk_config().await)
            .timeout_config(
                aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(2))
                    .operation_attempt_timeout(Duration::from_secs(30))
                    .operation_timeout(Duration::from_secs(60))
                    .build(),
            )
            .build(),
    );
    // A worker invocation may take a while (the first one builds the function).
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .context("building the HTTP client")?;
    eprintln!(
        "dev: bridging {} -> worker at {}; scheduler every {} s (Ctrl-C stops)",
        args.queue_url, args.invoke_url, args.tick_secs
    );
    let bridge = async {
        loop {
            let invoke = |event| {
                let http = &http;
                async move {
                    let value =
                        bridge::invoke_function(http, &args.invoke_url, "worker", &event).await?;
                    serde_json::from_value(value).context("reading the worker's SqsBatchResponse")
                }
            };
            match bridge::pump_once(&sqs, &args.queue_url, 10, invoke).await {
                Ok(r) if r.received > 0 => {
                    eprintln!(
                        "bridge: {} message(s), {} done, {} left for redelivery",
                        r.received, r.deleted, r.failed
                    )
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("bridge: {e:#}");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    };
    let ticker = async {
        if args.tick_secs == 0 {
            return std::future::pending().await;
        }
        let mut interval = tokio::time::interval(Duration::from_secs(args.tick_secs));
        loop {
            interval.tick().await;
            match bridge::invoke_function(
                &http,
                &args.invoke_url,
                "scheduler",
                &bridge::scheduled_event(),
            )
            .await
            {
                Ok(report) => eprintln!(
                    "scheduler: rescued {}, purged {}, errors {}",
                    report["rescued"].as_array().map_or(0, Vec::len),
                    report["purged"],
                    report["errors"].as_array().map_or(0, Vec::len)
                ),
                Err(e) => eprintln!("scheduler: {e:#}"),
            }
        }
    };
    tokio::select! {
        _ = bridge => Ok(()),
        _ = ticker => Ok(()),
        signal = tokio::signal::ctrl_c() => {
            signal.context("waiting for Ctrl-C")?;
            eprintln!("dev: stopped");
            Ok(())
        }
    }
}
