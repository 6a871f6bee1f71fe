//! Local stand-ins for what AWS does between the functions: the SQS event source mapping
//! (long-poll the queue, invoke the worker with a real SQS batch, delete only what it did not
//! report as failed) and the EventBridge schedule (invoke the scheduler with a scheduled event).

use std::future::Future;

use anyhow::Context;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use chrono::Utc;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PumpReport {
    pub received: usize,
    pub deleted: usize,
    pub failed: usize,
}

/// The queue's name from its URL (the last path segment).
fn queue_name(queue_url: &str) -> &str {
    queue_url.rsplit('/').next().unwrap_or(queue_url)
}

/// The Lambda SQS event for received messages, as the event source mapping builds it.
pub fn sqs_event(messages: &[aws_sdk_sqs::types::Message], queue_url: &str) -> SqsEvent {
    let arn = format!(
        "arn:aws:sqs:us-east-1:000000000000:{}",
        queue_name(queue_url)
    );
    let mut event = SqsEvent::default();
    for m in messages {
        let mut record = SqsMessage::default();
        record.message_id = m.message_id.clone();
        record.receipt_handle = m.receipt_handle.clone();
        record.body = m.body.clone();
        record.md5_of_body = m.md5_of_body.clone();
        // The trace context the sender put on the message (platform::telemetry), as the event
        // source mapping passes message attributes on.
        for (name, value) in m.message_attributes().into_iter().flatten() {
            let mut attribute = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
            attribute.string_value = value.string_value.clone();
            attribute.data_type = Some(value.data_type.clone());
            record.message_attributes.insert(name.clone(), attribute);
        }
        record.event_source = Some("aws:sqs".into());
        record.event_source_arn = Some(arn.clone());
        record.aws_region = Some("us-east-1".into());
        event.records.push(record);
    }
    event
}

/// Receives one batch and hands it to `invoke`. Messages the worker reports in
/// `batchItemFailures`, or all of them when the invocation itself fails, stay on the queue and
/// come back after the visibility timeout, as with the real event source mapping.
pub async fn pump_once<F, Fut>(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    wait_secs: i32,
    invoke: F,
) -> anyhow::Result<PumpReport>
where
    F: FnOnce(SqsEvent) -> Fut,
    Fut: Future<Output = anyhow::Result<SqsBatchResponse>>,
{
    let received = sqs
        .receive_message()
        .queue_url(queue_url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .wait_time_seconds(wait_secs)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(&e)))
        .context("receiving from the queue")?;
    let messages = received.messages.unwrap_or_default();
    let mut report = PumpReport {
        received: messages.len(),
        ..Default::default()
    };
    if messages.is_empty() {
        return Ok(report);
    }
    let event = sqs_event(&messages, queue_url);
    let failed: Vec<String> = match invoke(event).await {
        Ok(response) => response
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect(),
        Err(e) => {
            tracing::warn!(
                error = format!("{e:#}"),
                "worker invocation failed; the batch stays on the queue"
            );
            messages
                .iter()
                .filter_map(|m| m.message_id.clone())
                .collect()
        }
    };
    // What the worker did not report is acknowledged in one DeleteMessageBatch, as the event
    // source mapping does.
    let mut entries = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if m.message_id.as_ref().is_some_and(|id| failed.contains(id)) {
            report.failed += 1;
            continue;
        }
        if let Some(handle) = m.receipt_handle() {
            let entry = aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                .id(i.to_string())
                .receipt_handle(handle)
                .build()
                .context("a delete entry")?;
            entries.push(entry);
        }
    }
    if entries.is_empty() {
        return Ok(report);
    }
    let deleted = sqs
        .delete_message_batch()
        .queue_url(queue_url)
        .set_entries(Some(entries))
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{}", aws_sdk_sqs::error::DisplayErrorContext(&e)))
        .context("deleting the processed messages")?;
    report.deleted = deleted.successful.len();
    if let Some(refused) = deleted.failed.first() {
        // A message not deleted comes back after its visibility timeout: the worker finds its
        // event final and skips it.
        anyhow::bail!(
            "{} of the processed messages were not deleted: {} ({})",
            deleted.failed.len(),
            refused.code,
            refused.message.as_deref().unwrap_or("no message")
        );
    }
    Ok(report)
}

/// Invokes a function through the Lambda Invoke API that `cargo lambda watch` serves.
pub async fn invoke_function(
    http: &reqwest::Client,
    invoke_base_url: &str,
    function: &str,
    payload: &impl Serialize,
) -> anyhow::Result<Value> {
    let url = format!(
        "{}/2015-03-31/functions/{function}/invocations",
        invoke_base_url.trim_end_matches('/')
    );
    let response = http
        .post(&url)
        .json(payload)
        .send()
        .await
        .with_context(|| format!("invoking {function} at {url}"))?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        anyhow::bail!("{function} answered {status}: {body}");
    }
    Ok(body)
}

/// The classic EventBridge scheduled-rule event, as SAM's `Schedule` sends it.
pub fn scheduled_event() -> Value {
    json!({
        "version": "0",
        "id": format!("local-{}", Utc::now().timestamp_millis()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "000000000000",
        "time": Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:000000000000:rule/billing-inbox-local"],
        "detail": {}
    })
}
