//! The SQS client: a message names one stored event by its row id; the row is the fact, the
//! message a nudge. Sending goes through `queued::enqueue_or_unmark`.

use std::time::Duration;

use anyhow::Context;
use aws_config::retry::RetryConfig;
use aws_config::stalled_stream_protection::StalledStreamProtectionConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;

use crate::platform::aws_limits;

/// A message body is the event's row id in decimal; the row is the fact, the message a nudge.
pub fn message_body(event_id: i64) -> String {
    event_id.to_string()
}

pub fn parse_message_body(body: &str) -> Option<i64> {
    body.trim().parse().ok()
}

/// The sending span's trace context as the message's `traceparent` attribute, so the function
/// that takes the message continues the trace (platform::telemetry); none when no trace is
/// recorded. One String attribute of 55 characters: well within SQS's 10 attributes a
/// message, and its bytes count toward the 256 KiB message size (docs/design.md §2.1).
fn trace_attributes(
) -> Option<std::collections::HashMap<String, aws_sdk_sqs::types::MessageAttributeValue>> {
    let traceparent = crate::platform::telemetry::traceparent()?;
    let value = aws_sdk_sqs::types::MessageAttributeValue::builder()
        .data_type("String")
        .string_value(traceparent)
        .build()
        .ok()?;
    Some(std::collections::HashMap::from([(
        crate::platform::telemetry::TRACEPARENT.to_owned(),
        value,
    )]))
}

/// The `traceparent` a received message carries (Lambda's SQS event), if any.
pub fn message_traceparent(message: &aws_lambda_events::event::sqs::SqsMessage) -> Option<&str> {
    message
        .message_attributes
        .get(crate::platform::telemetry::TRACEPARENT)
        .and_then(|attribute| attribute.string_value.as_deref())
}

#[derive(Clone)]
pub struct Queue {
    transport: Transport,
}

#[derive(Clone)]
enum Transport {
    Sqs {
        /// Built on the first send when the queue comes from the environment: a cold start
        /// reads no AWS configuration before its first event.
        client: std::sync::Arc<tokio::sync::OnceCell<aws_sdk_sqs::Client>>,
        url: String,
    },
    /// The simulator's queue (docs/design.md §10).
    #[cfg(feature = "dev")]
    Sim(std::sync::Arc<dyn crate::platform::sim::SimQueue>),
}

/// Loads the standard AWS configuration (`AWS_ENDPOINT_URL`, region, credentials) with
/// short timeouts: a send that cannot complete quickly is left to the scheduler's rescue.
/// Stalled-stream protection is off: every body here is a few bytes, and the timeouts
/// already bound a stalled call; it cost the intake a throughput check per send.
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .operation_attempt_timeout(Duration::from_secs(3))
                .operation_timeout(Duration::from_secs(8))
                .build(),
        )
        .retry_config(RetryConfig::standard().with_max_attempts(2))
        .load()
        .await
}

impl Queue {
    pub fn new(client: aws_sdk_sqs::Client, url: impl Into<String>) -> Self {
        Self {
            transport: Transport::Sqs {
                client: std::sync::Arc::new(tokio::sync::OnceCell::new_with(Some(client))),
                url: url.into(),
            },
        }
    }

    /// A queue whose client is configured from the environment on its first send.
    pub async fn from_env(url: impl Into<String>) -> Self {
        Self {
            transport: Transport::Sqs {
                client: std::sync::Arc::new(tokio::sync::OnceCell::new()),
                url: url.into(),
            },
        }
    }

    /// The client, built on first use. Boxed: loading the AWS configuration is a large
    /// future, and the scheduler nests sends deep.
    async fn sqs(cell: &tokio::sync::OnceCell<aws_sdk_sqs::Client>) -> &aws_sdk_sqs::Client {
        let build = || -> crate::BoxFuture<'static, aws_sdk_sqs::Client> {
            Box::pin(async { aws_sdk_sqs::Client::new(&sdk_config().await) })
        };
        Box::pin(cell.get_or_init(build)).await
    }

    /// A queue the simulator keeps in memory.
    #[cfg(feature = "dev")]
    pub fn simulated(queue: std::sync::Arc<dyn crate::platform::sim::SimQueue>) -> Self {
        Self {
            transport: Transport::Sim(queue),
        }
    }

    #[tracing::instrument(skip_all, fields(event_id))]
    pub async fn send_event(&self, event_id: i64) -> anyhow::Result<()> {
        let (client, url) = match &self.transport {
            Transport::Sqs { client, url } => (Self::sqs(client).await, url),
            #[cfg(feature = "dev")]
            Transport::Sim(queue) => {
                return match queue.send(&[event_id]).is_empty() {
                    true => Ok(()),
                    false => Err(anyhow::anyhow!("the simulated queue refused the message")),
                };
            }
        };
        client
            .send_message()
            .queue_url(url)
            .message_body(message_body(event_id))
            .set_message_attributes(trace_attributes())
            .send()
            .await
            .context("SQS SendMessage")?;
        Ok(())
    }
}

impl Queue {
    /// Sends event ids, with SendMessageBatch (10 per call) when there are several; a message
    /// is the id alone, a few bytes whatever the event's size. Returns the
    /// ids that did not reach the queue, so the caller can leave them for a later attempt.
    pub async fn send_events(&self, event_ids: &[i64]) -> Vec<i64> {
        if let [event_id] = event_ids {
            // One id (the intake's case): a plain SendMessage, one request either way.
            // Boxed: the SDK future is large, and the scheduler nests this one deep.
            return match Box::pin(self.send_event(*event_id)).await {
                Ok(()) => Vec::new(),
                Err(e) => {
                    tracing::warn!(event_id, error = format!("{e:#}"), "SQS SendMessage failed");
                    vec![*event_id]
                }
            };
        }
        #[cfg(feature = "dev")]
        if let Transport::Sim(queue) = &self.transport {
            return queue.send(event_ids);
        }
        let bodies: Vec<String> = event_ids.iter().map(|id| message_body(*id)).collect();
        let unsent = Box::pin(self.send_bodies(&bodies)).await;
        unsent
            .iter()
            .filter_map(|b| parse_message_body(b))
            .collect()
    }

    /// Sends each body as one message, with SendMessageBatch: at most 10 entries and 256 KiB
    /// of bodies a request, as SQS documents ([`aws_limits::sqs_batches`]; the local server
    /// takes more). Returns the bodies that did not reach the queue, a body SQS would refuse
    /// on its own (empty, over 256 KiB, a character outside its set) among them, never sent.
    pub async fn send_bodies(&self, bodies: &[String]) -> Vec<String> {
        use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
        let (client, url) = match &self.transport {
            Transport::Sqs { client, url } => (Self::sqs(client).await, url),
            #[cfg(feature = "dev")]
            Transport::Sim(_) => return bodies.to_vec(),
        };
        let (batches, refused) = aws_limits::sqs_batches(bodies);
        let traced = trace_attributes();
        let mut unsent = Vec::new();
        for (body, problem) in refused {
            tracing::error!(problem, "a message SQS would refuse is not sent");
            unsent.push(body.clone());
        }
        for chunk in batches {
            // Entry ids are the body's place in its chunk: SQS wants them short and plain.
            let entries: Result<Vec<_>, _> = chunk
                .iter()
                .enumerate()
                .map(|(i, body)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(format!("m{i}"))
                        .message_body(*body)
                        .set_message_attributes(traced.clone())
                        .build()
                })
                .collect();
            let sent = match entries {
                Ok(entries) => {
                    client
                        .send_message_batch()
                        .queue_url(url)
                        .set_entries(Some(entries))
                        .send()
                        .await
                }
                Err(e) => {
                    tracing::error!(error = %e, "building an SQS batch");
                    unsent.extend(chunk.into_iter().cloned());
                    continue;
                }
            };
            match sent {
                Ok(output) => {
                    for failed in output.failed() {
                        let place = failed
                            .id()
                            .strip_prefix('m')
                            .and_then(|s| s.parse::<usize>().ok());
                        if let Some(body) = place.and_then(|i| chunk.get(i)) {
                            unsent.push((*body).clone());
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %aws_sdk_sqs::error::DisplayErrorContext(&e), "SQS SendMessageBatch failed");
                    unsent.extend(chunk.into_iter().cloned());
                }
            }
        }
        unsent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_body_round_trips() {
        assert_eq!(parse_message_body(&message_body(42)), Some(42));
        assert_eq!(parse_message_body(" 7\n"), Some(7));
        assert_eq!(parse_message_body("x"), None);
    }
}
