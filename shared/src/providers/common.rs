//! What the providers' envelope readers have in common: readers for JSON. The signature checks
//! they share live in [`crate::signing`].

use serde_json::Value;

use crate::domain::CustomerId;

/// A string at a JSON pointer, if it is one.
pub(crate) fn str_at<'a>(value: &'a Value, pointer: &str) -> Option<&'a str> {
    value.pointer(pointer).and_then(Value::as_str)
}

/// Customer at a pointer that holds either an id or an expanded object with an id.
pub(crate) fn customer_at(value: &Value, pointer: &str) -> Option<CustomerId> {
    let found = value.pointer(pointer)?;
    let raw = found
        .as_str()
        .or_else(|| found.get("id").and_then(Value::as_str))?;
    CustomerId::parse(raw).ok()
}
