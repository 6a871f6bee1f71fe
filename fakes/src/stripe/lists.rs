//! How Stripe answers a list and an error, for every read route of the fake: the list object
//! and its paging, the error body, and the query's plain parameters.

use serde_json::{json, Value};

/// "Limit can range between 1 and 100, and the default is 10." (stripe/openapi, every list's
/// `limit` parameter; docs.stripe.com/api/pagination)
const DEFAULT_LIMIT: usize = 10;
const MAX_LIMIT: usize = 100;

/// Stripe's error body: "`{"error": {type, code, doc_url, message, param}}`"
/// (docs.stripe.com/api/errors: `type` one of `api_error`, `card_error`, `idempotency_error`,
/// `invalid_request_error`; `doc_url` "a URL to more information about the error code
/// reported").
pub(super) fn error(
    status: u16,
    code: Option<&str>,
    message: String,
    param: Option<&str>,
) -> (u16, Value) {
    let mut error = json!({"type": "invalid_request_error", "message": message});
    if let Some(code) = code {
        error["code"] = json!(code);
        error["doc_url"] = json!(format!(
            "https://stripe.com/docs/error-codes/{}",
            code.replace('_', "-")
        ));
    }
    if let Some(param) = param {
        error["param"] = json!(param);
    }
    (status, json!({ "error": error }))
}

/// "resource_missing: The ID provided is not valid. Either the resource does not exist, or an
/// ID for a different resource has been provided." (docs.stripe.com/error-codes), a 404 "The
/// requested resource doesn't exist." (docs.stripe.com/api/errors); the message as Stripe
/// words it ("No such subscription: 'sub_…'").
pub(super) fn missing(noun: &str, id: &str, param: &str) -> (u16, Value) {
    error(
        404,
        Some("resource_missing"),
        format!("No such {noun}: '{id}'"),
        Some(param),
    )
}

pub(super) fn get<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

pub(super) fn created(object: &Value) -> i64 {
    object
        .get("created")
        .and_then(Value::as_i64)
        .unwrap_or_default()
}

/// One page of `listed` (already in list order) as Stripe's list object: "`object`: always
/// `list`", "`data`", "`has_more`: Whether or not there are more elements available after this
/// set", "`url`: The URL for accessing this list" (docs.stripe.com/api/pagination). `limit`
/// "can range between 1 and 100, and the default is 10"; `starting_after` "defines your place
/// in the list", the page the objects after it; `ending_before` the page before it (ibid.).
pub(super) fn page(url: &str, listed: Vec<Value>, query: &[(String, String)]) -> (u16, Value) {
    let limit = match get(query, "limit").map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(limit)) if (1..=MAX_LIMIT).contains(&limit) => limit,
        Some(_) => {
            return error(
                400,
                None,
                "Invalid limit: must be between 1 and 100".into(),
                Some("limit"),
            )
        }
    };
    let position = |param: &str, id: &str| {
        listed
            .iter()
            .position(|o| o["id"] == id)
            .ok_or(param.to_owned())
    };
    let (from, until) = match (get(query, "starting_after"), get(query, "ending_before")) {
        (Some(_), Some(_)) => {
            return error(
                400,
                None,
                "You may only specify one of these parameters: ending_before, starting_after."
                    .into(),
                Some("ending_before"),
            )
        }
        (Some(after), None) => match position("starting_after", after) {
            Ok(at) => (at + 1, (at + 1 + limit).min(listed.len())),
            // A cursor the list does not hold: Stripe names the object it cannot find.
            Err(param) => return missing("object", after, &param),
        },
        (None, Some(before)) => match position("ending_before", before) {
            Ok(at) => (at.saturating_sub(limit), at),
            Err(param) => return missing("object", before, &param),
        },
        (None, None) => (0, limit.min(listed.len())),
    };
    // `has_more` is more in the direction the page was read: after it, or before it for an
    // `ending_before` page.
    let has_more = match get(query, "ending_before") {
        Some(_) => from > 0,
        None => until < listed.len(),
    };
    (
        200,
        json!({"object": "list", "url": url, "has_more": has_more,
               "data": listed[from..until].to_vec()}),
    )
}
