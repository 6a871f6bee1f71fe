//! What every metric line shares, whichever layer prints it: the CloudWatch namespace, the
//! `Stack` dimension, and the Embedded Metric Format envelope around them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// The CloudWatch namespace of every metric the functions print (Embedded Metric Format).
pub const NAMESPACE: &str = "BillingInbox";

/// The dimension every metric carries first: the stack that printed it, so that two stacks
/// in one account and Region (staging and production) keep their metrics and alarms apart.
pub const STACK_DIMENSION: &str = "Stack";

/// The variable that names the stack (the template sets it to `AWS::StackName`).
pub const STACK_VAR: &str = "INBOX_STACK";

/// The stack's name when [`STACK_VAR`] is unset or empty: a local run, a test.
pub const LOCAL_STACK: &str = "local";

/// Read once per process, like the rest of the configuration.
static STACK: LazyLock<String> = LazyLock::new(|| {
    std::env::var(STACK_VAR)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| LOCAL_STACK.to_owned())
});

/// Whether metric lines go to stderr instead of stdout ([`print_to_stderr`]).
static TO_STDERR: AtomicBool = AtomicBool::new(false);

/// Sends this process's metric lines to stderr: for a command-line tool running the
/// functions' code in process, whose stdout is its answer (`inboxctl --json`).
pub fn print_to_stderr() {
    TO_STDERR.store(true, Ordering::Relaxed);
}

/// Prints one metric line: to stdout, which the Lambda runtime ships to CloudWatch Logs, where
/// the Embedded Metric Format makes it a metric; to stderr after [`print_to_stderr`].
pub fn emit(line: impl std::fmt::Display) {
    match TO_STDERR.load(Ordering::Relaxed) {
        true => eprintln!("{line}"),
        false => println!("{line}"),
    }
}

/// The stack's name, as every metric line carries it.
pub fn stack() -> &'static str {
    &STACK
}

/// An Embedded Metric Format document: `metrics` (name, unit) under `NAMESPACE`, reported
/// under each of `dimension_sets` with [`STACK_DIMENSION`] put first, and the `Stack` field
/// set. The caller adds each metric's value and each other dimension's field.
pub fn document(now: DateTime<Utc>, dimension_sets: &[&[&str]], metrics: &[(&str, &str)]) -> Value {
    let dimensions: Vec<Vec<&str>> = dimension_sets
        .iter()
        .map(|set| {
            std::iter::once(STACK_DIMENSION)
                .chain(set.iter().copied())
                .collect()
        })
        .collect();
    let mut document = json!({
        "_aws": {
            "Timestamp": now.timestamp_millis(),
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": dimensions,
                "Metrics": metrics
                    .iter()
                    .map(|(name, unit)| json!({"Name": name, "Unit": unit}))
                    .collect::<Vec<_>>()
            }]
        }
    });
    document[STACK_DIMENSION] = json!(stack());
    document
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dimension_set_starts_with_the_stack() {
        let doc = document(
            Utc::now(),
            &[&[], &["Source"]],
            &[("Things", "Count"), ("Age", "Seconds")],
        );
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], NAMESPACE);
        assert_eq!(
            directive["Dimensions"],
            json!([["Stack"], ["Stack", "Source"]])
        );
        assert_eq!(
            directive["Metrics"],
            json!([{"Name": "Things", "Unit": "Count"}, {"Name": "Age", "Unit": "Seconds"}])
        );
        assert_eq!(doc["Stack"], stack());
    }
}
