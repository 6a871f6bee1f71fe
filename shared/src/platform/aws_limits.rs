//! The limits AWS documents for the calls the project makes to SQS, EventBridge and Secrets
//! Manager, as constants and small checks, each beside the page that states it. The local
//! servers the tests use are friendlier than AWS on several of them (docs/design.md §1.5,
//! *What the local AWS servers let through*), so the code holds itself to these, and the
//! tests check every request it sends against them.

/// SQS: a SendMessageBatch (and DeleteMessageBatch, ChangeMessageVisibilityBatch) carries at
/// most 10 entries ("You can use SendMessageBatch to send up to 10 messages",
/// <https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessageBatch.html>).
pub const SQS_MAX_BATCH_ENTRIES: usize = 10;

/// SQS: one message, and the sum of a batch's message bodies, at most 256 KiB (262,144
/// bytes). The SendMessageBatch page now says 1 MiB, raised in 2025; the project holds
/// itself to the 256 KiB it said before, which every queue takes (a queue's
/// `MaximumMessageSize` can still be set lower than 1 MiB).
pub const SQS_MAX_MESSAGE_BYTES: usize = 262_144;

/// SQS: a batch entry's `Id` "can have up to 80 characters. The following characters are
/// accepted: alphanumeric characters, hyphens(-), and underscores (_)", and the ids of one
/// request are unique
/// (<https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_SendMessageBatchRequestEntry.html>).
pub const SQS_MAX_BATCH_ENTRY_ID_CHARS: usize = 80;

/// SQS: `ReceiveMessage` returns 1 to 10 messages (`MaxNumberOfMessages`, "Valid values: 1 to
/// 10") and long-polls for at most 20 s (`WaitTimeSeconds`; "The maximum long polling wait
/// time is 20 seconds",
/// <https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ReceiveMessage.html>,
/// <https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/best-practices-setting-up-long-polling.html>).
pub const SQS_MAX_RECEIVE: i32 = 10;
pub const SQS_MAX_WAIT_TIME_SECS: i32 = 20;

/// SQS: a visibility timeout, the queue's or one set by `ReceiveMessage` or
/// `ChangeMessageVisibility`, is 0 to 43,200 s (12 hours)
/// (<https://docs.aws.amazon.com/AWSSimpleQueueService/latest/APIReference/API_ChangeMessageVisibility.html>).
pub const SQS_MAX_VISIBILITY_TIMEOUT_SECS: i32 = 43_200;

/// EventBridge: `PutEvents` takes 1 to 10 entries ("Array Members: Minimum number of 1 item.
/// Maximum number of 10 items",
/// <https://docs.aws.amazon.com/eventbridge/latest/APIReference/API_PutEvents.html>).
pub const PUT_EVENTS_MAX_ENTRIES: usize = 10;

/// EventBridge: "The total entry size must be less than 256KB", counted as the page
/// *Calculating PutEvents event entry size* says ([`put_events_entry_size`],
/// <https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-putevent-size.html>).
pub const PUT_EVENTS_MAX_BYTES: usize = 262_144;

/// EventBridge: `DetailType` is 1 to 128 characters, `Source` 1 to 256 and not under the
/// service-reserved prefix `aws.`
/// (<https://docs.aws.amazon.com/eventbridge/latest/APIReference/API_PutEventsRequestEntry.html>).
pub const DETAIL_TYPE_MAX_CHARS: usize = 128;
pub const SOURCE_MAX_CHARS: usize = 256;

/// Secrets Manager: "You can store any text or binary in a Secrets Manager secret up to the
/// maximum size of 65,536 Bytes"
/// (<https://docs.aws.amazon.com/secretsmanager/latest/userguide/reference_secret_json_structure.html>).
pub const SECRET_MAX_BYTES: usize = 65_536;

/// Whether a batch entry id is one SQS takes: 1 to 80 letters, digits, `-` and `_`.
pub fn is_batch_entry_id(id: &str) -> bool {
    (1..=SQS_MAX_BATCH_ENTRY_ID_CHARS).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Why SQS would refuse `body` as a message, if it would: empty, over
/// [`SQS_MAX_MESSAGE_BYTES`], or holding a character outside the set SendMessage allows
/// ("#x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF";
/// Rust strings hold no surrogates, so the ranges come down to the controls and U+FFFE/FFFF).
pub fn message_problem(body: &str) -> Option<String> {
    if body.is_empty() {
        return Some("the message body is empty".to_owned());
    }
    if body.len() > SQS_MAX_MESSAGE_BYTES {
        return Some(format!(
            "the message body is {} bytes, over SQS's {SQS_MAX_MESSAGE_BYTES}",
            body.len()
        ));
    }
    let allowed = |c: char| {
        matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
    };
    body.chars().find(|c| !allowed(*c)).map(|c| {
        format!(
            "the message body holds U+{:04X}, which SQS refuses",
            c as u32
        )
    })
}

/// Splits message bodies into SendMessageBatch requests: at most
/// [`SQS_MAX_BATCH_ENTRIES`] entries and [`SQS_MAX_MESSAGE_BYTES`] of bodies each, in order.
/// A body SQS would refuse on its own ([`message_problem`]) is in no batch: it comes back
/// in the second list, with why.
pub fn sqs_batches(bodies: &[String]) -> (Vec<Vec<&String>>, Vec<(&String, String)>) {
    let mut batches: Vec<Vec<&String>> = Vec::new();
    let mut refused = Vec::new();
    let mut bytes = 0;
    for body in bodies {
        if let Some(problem) = message_problem(body) {
            refused.push((body, problem));
            continue;
        }
        match batches.last_mut() {
            Some(batch)
                if batch.len() < SQS_MAX_BATCH_ENTRIES
                    && bytes + body.len() <= SQS_MAX_MESSAGE_BYTES =>
            {
                bytes += body.len();
                batch.push(body);
            }
            _ => {
                bytes = body.len();
                batches.push(vec![body]);
            }
        }
    }
    (batches, refused)
}

/// The size EventBridge counts for one `PutEvents` entry: the UTF-8 bytes of `Source`,
/// `DetailType`, `Detail` and each of `Resources`, and 14 bytes for a `Time`
/// (<https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-putevent-size.html>).
pub fn put_events_entry_size(
    source: &str,
    detail_type: &str,
    detail: Option<&str>,
    resources: &[String],
    has_time: bool,
) -> usize {
    let time = if has_time { 14 } else { 0 };
    time + source.len()
        + detail_type.len()
        + detail.map_or(0, str::len)
        + resources.iter().map(String::len).sum::<usize>()
}

/// Why EventBridge would refuse an entry of this `Source`, `DetailType` and `Detail`, if it
/// would: a source out of its length or under `aws.`, a detail type out of 1 to 128
/// characters, a detail that is not a JSON object ("A valid JSON object. There is no other
/// schema imposed", the PutEventsRequestEntry page), or an entry of 256 KB or more.
pub fn put_events_entry_problem(source: &str, detail_type: &str, detail: &str) -> Option<String> {
    let source_chars = source.chars().count();
    if !(1..=SOURCE_MAX_CHARS).contains(&source_chars) || source.starts_with("aws.") {
        return Some(format!(
            "the Source '{source}' is not 1 to {SOURCE_MAX_CHARS} characters outside 'aws.'"
        ));
    }
    let type_chars = detail_type.chars().count();
    if !(1..=DETAIL_TYPE_MAX_CHARS).contains(&type_chars) {
        return Some(format!(
            "the DetailType is {type_chars} characters, not 1 to {DETAIL_TYPE_MAX_CHARS}"
        ));
    }
    let size = put_events_entry_size(source, detail_type, Some(detail), &[], false);
    if size >= PUT_EVENTS_MAX_BYTES {
        return Some(format!(
            "the entry is {size} bytes; EventBridge takes less than {PUT_EVENTS_MAX_BYTES}"
        ));
    }
    match serde_json::from_str::<serde_json::Value>(detail) {
        Ok(serde_json::Value::Object(_)) => None,
        Ok(_) => Some("the Detail is JSON but not an object".to_owned()),
        Err(_) => Some("the Detail is not JSON".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_entry_ids_are_letters_digits_hyphens_and_underscores_up_to_80() {
        assert!(is_batch_entry_id("m0"));
        assert!(is_batch_entry_id("a-B_9"));
        assert!(is_batch_entry_id(&"x".repeat(80)));
        assert!(!is_batch_entry_id(&"x".repeat(81)));
        assert!(!is_batch_entry_id(""));
        assert!(!is_batch_entry_id("a.b"));
        assert!(!is_batch_entry_id("eff:1"));
    }

    #[test]
    fn a_message_body_is_one_to_262144_bytes_of_the_characters_sqs_allows() {
        assert_eq!(message_problem("42"), None);
        assert_eq!(message_problem("tab\tnew\nline\r é 😀"), None);
        assert_eq!(message_problem(&"x".repeat(SQS_MAX_MESSAGE_BYTES)), None);
        assert!(message_problem("").is_some());
        assert!(message_problem(&"x".repeat(SQS_MAX_MESSAGE_BYTES + 1)).is_some());
        assert_eq!(
            message_problem("a\u{1}b").as_deref(),
            Some("the message body holds U+0001, which SQS refuses")
        );
        assert!(message_problem("\u{FFFF}").is_some());
    }

    #[test]
    fn bodies_are_split_into_batches_of_ten_and_of_256_kib_at_most() {
        let ids: Vec<String> = (0..23).map(|i| i.to_string()).collect();
        let (batches, refused) = sqs_batches(&ids);
        assert_eq!(
            batches.iter().map(Vec::len).collect::<Vec<_>>(),
            [10, 10, 3]
        );
        assert!(refused.is_empty());
        let flat: Vec<&String> = batches.into_iter().flatten().collect();
        assert_eq!(flat, ids.iter().collect::<Vec<_>>(), "in order, each once");

        // Three bodies of 100 KiB: two fill a batch, the third starts the next.
        let big: Vec<String> = (0..3).map(|_| "x".repeat(100 * 1024)).collect();
        let (batches, _) = sqs_batches(&big);
        assert_eq!(batches.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1]);

        let mixed = vec!["1".to_owned(), String::new(), "x".repeat(300 * 1024)];
        let (batches, refused) = sqs_batches(&mixed);
        assert_eq!(batches, [vec![&mixed[0]]]);
        assert_eq!(refused.len(), 2);
    }

    #[test]
    fn an_entry_is_sized_as_eventbridge_counts_it() {
        // The page's own rule: Time 14 bytes, then the UTF-8 bytes of each field ("é" is two).
        assert_eq!(put_events_entry_size("s", "dt", Some("{}"), &[], false), 5);
        assert_eq!(
            put_events_entry_size("s", "dt", Some("{\"é\":1}"), &["arn:x".into()], true),
            14 + 1 + 2 + 8 + 5
        );
    }

    #[test]
    fn an_entry_eventbridge_refuses_is_named() {
        let ok = put_events_entry_problem("billing-inbox", "billing.plan_changed", "{}");
        assert_eq!(ok, None);
        for (source, detail_type, detail) in [
            ("aws.billing", "t", "{}"),
            ("", "t", "{}"),
            ("s", "", "{}"),
            ("s", &"t".repeat(129) as &str, "{}"),
            ("s", "t", "[1]"),
            ("s", "t", "\"text\""),
            ("s", "t", "not json"),
        ] {
            assert!(
                put_events_entry_problem(source, detail_type, detail).is_some(),
                "{source} {detail_type} {detail}"
            );
        }
        assert_eq!(put_events_entry_problem("s", &"t".repeat(128), "{}"), None);
        // 262,144 bytes counted: refused; one byte less: taken.
        let fill = |n: usize| format!("{{\"x\":\"{}\"}}", "y".repeat(n));
        let at_limit = fill(PUT_EVENTS_MAX_BYTES - 2 - 8);
        assert_eq!(
            put_events_entry_size("s", "t", Some(&at_limit), &[], false),
            PUT_EVENTS_MAX_BYTES
        );
        assert!(put_events_entry_problem("s", "t", &at_limit).is_some());
        assert_eq!(
            put_events_entry_problem("s", "t", &fill(PUT_EVENTS_MAX_BYTES - 2 - 9)),
            None
        );
    }
}
