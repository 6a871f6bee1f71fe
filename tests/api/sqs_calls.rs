//! Every SQS call the pipeline makes, against the local SQS server (docs/design.md §1.5), with
//! the behaviour the pipeline relies on: CreateQueue (idempotent, with attributes), SendMessage
//! (the intake), SendMessageBatch (rescue, replay, reconciliation), ReceiveMessage with a long
//! poll and at most ten messages (the event source mapping), the visibility timeout (an
//! unacknowledged message comes back), DeleteMessageBatch (the bridge's acknowledgement, as the
//! event source mapping's, with a per-entry refusal for a handle it does not know), and
//! DeleteQueue. The server is picked for speed; this test keeps it honest.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use shared::platform::queue::{parse_message_body, Queue};

use crate::helpers::*;

async fn receive(
    sqs: &aws_sdk_sqs::Client,
    url: &str,
    wait: i32,
) -> Vec<aws_sdk_sqs::types::Message> {
    sqs.receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(wait)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default()
}

fn ids(messages: &[aws_sdk_sqs::types::Message]) -> BTreeSet<i64> {
    messages
        .iter()
        .map(|m| parse_message_body(m.body().unwrap()).unwrap())
        .collect()
}

#[tokio::test]
async fn the_sqs_server_serves_every_call_the_pipeline_makes() {
    let sqs = sqs_client().await;
    let name = format!("calls-{}", uuid::Uuid::new_v4().simple());
    let create = || {
        sqs.create_queue()
            .queue_name(&name)
            .attributes(QueueAttributeName::VisibilityTimeout, "4")
            .send()
    };
    let url = create().await.unwrap().queue_url.unwrap();
    assert_eq!(
        create().await.unwrap().queue_url.unwrap(),
        url,
        "CreateQueue with the same attributes is idempotent"
    );
    let queue = Queue::new(sqs.clone(), url.clone());

    // SendMessage (one id), then SendMessageBatch (twelve ids: two requests of ten and two).
    queue.send_event(1).await.unwrap();
    let batch: Vec<i64> = (100..112).collect();
    assert_eq!(queue.send_events(&batch).await, Vec::<i64>::new());

    // ReceiveMessage: at most ten per call; together, every id once.
    let mut seen = BTreeSet::new();
    let mut received = Vec::new();
    while seen.len() < 13 {
        let messages = receive(&sqs, &url, 1).await;
        assert!(
            !messages.is_empty(),
            "ReceiveMessage returned nothing with {} of 13",
            seen.len()
        );
        assert!(messages.len() <= 10);
        seen.extend(ids(&messages));
        received.extend(messages);
    }
    let expected: BTreeSet<i64> = std::iter::once(1).chain(batch.iter().copied()).collect();
    assert_eq!(seen, expected);
    assert!(
        receive(&sqs, &url, 0).await.is_empty(),
        "received messages are invisible for the visibility timeout"
    );

    // DeleteMessageBatch acknowledges; an entry it cannot take is refused on its own.
    let (keep, delete) = received.split_at(1);
    let delete_batch = |handles: Vec<&str>| {
        let entries = handles
            .into_iter()
            .enumerate()
            .map(|(i, handle)| {
                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                    .id(format!("m{i}"))
                    .receipt_handle(handle)
                    .build()
                    .unwrap()
            })
            .collect();
        sqs.delete_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send()
    };
    let mut handles: Vec<&str> = delete[..9]
        .iter()
        .map(|m| m.receipt_handle().unwrap())
        .collect();
    handles.push("not-a-receipt-handle");
    let deleted = delete_batch(handles).await.unwrap();
    assert_eq!(deleted.successful.len(), 9);
    assert_eq!(
        deleted
            .failed
            .iter()
            .map(|f| f.id.as_str())
            .collect::<Vec<_>>(),
        ["m9"],
        "the unknown handle is refused, the rest deleted"
    );
    let rest = delete[9..]
        .iter()
        .map(|m| m.receipt_handle().unwrap())
        .collect();
    let deleted = delete_batch(rest).await.unwrap();
    assert_eq!((deleted.successful.len(), deleted.failed.len()), (3, 0));
    let back_within = Instant::now() + Duration::from_secs(15);
    let back = loop {
        // A long poll that ends when the message is visible again.
        let messages = receive(&sqs, &url, 2).await;
        if !messages.is_empty() || Instant::now() > back_within {
            break messages;
        }
    };
    assert_eq!(
        ids(&back),
        ids(keep),
        "only the unacknowledged message comes back"
    );

    sqs.delete_queue().queue_url(&url).send().await.unwrap();
}
