//! Every request a provider fake receives, checked against the provider's published API
//! description (docs/design.md §6.6): the path and method are an operation it describes, every
//! query and body parameter is one the operation takes, the required ones are there, and each
//! value has the type, enum and length its schema gives. A fake answers what a test scripts;
//! this says whether the real provider would have taken the request at all.
//!
//! The descriptions are the providers' own OpenAPI files, trimmed to the routes the project
//! calls by `scripts/trim-openapi.py` and kept in `testdata/openapi/` (each names the upstream
//! file, commit and API version it was cut from). A test's provider server is a
//! [`ProviderServer`]: every request it receives is checked as it arrives, and the test fails
//! when the server is dropped if the description refused any.
//!
//! Stripe's bodies and queries are form-encoded with brackets (`payload[value]=3`,
//! `types[]=a&types[]=b`, `created[gte]=1`): they are rebuilt as the objects and arrays the
//! schema describes (OpenAPI's `deepObject` style), and a value is read as the type the schema
//! asks for (`timestamp=1700000000` as an integer) before the schema judges it. An object whose
//! schema lists its `properties` takes no other member: a provider refuses a parameter it does
//! not know (Stripe: "Received unknown parameter"), whether or not its file says
//! `additionalProperties: false`. The schemas are judged with `jsonschema` (OpenAPI 3.0's as
//! draft 4, whose `exclusiveMinimum` is a boolean as 3.0's is; 3.1's as 2020-12); a
//! request-validator crate that does the routing too (roas-http-validator) turns on
//! `serde_json`'s `arbitrary_precision` for the whole test build, which changes how the
//! project's own code reads numbers under test, so the routing is written here.

use std::collections::HashMap;
use std::net::TcpListener;
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::{Map, Value};
use wiremock::{Match, Mock, MockServer, Request, ResponseTemplate};

/// Stripe's API: `latest/openapi.spec3.json` of stripe/openapi, trimmed.
pub static STRIPE: LazyLock<Description> = LazyLock::new(|| {
    Description::load("Stripe", include_str!("../../testdata/openapi/stripe.json"))
});

/// Paddle Billing's API: `v1/openapi.yaml` of PaddleHQ/paddle-openapi, trimmed.
pub static PADDLE: LazyLock<Description> = LazyLock::new(|| {
    Description::load("Paddle", include_str!("../../testdata/openapi/paddle.json"))
});

/// Polar's API: `docs/openapi/2026-10.openapi.json` of polarsource/polar, trimmed.
pub static POLAR: LazyLock<Description> =
    LazyLock::new(|| Description::load("Polar", include_str!("../../testdata/openapi/polar.json")));

/// Kinde's Management API: `api/openapi.yaml` of kinde-oss/kinde-dotnet-sdk, trimmed, and
/// its OAuth token endpoint written from Kinde's docs (scripts/trim-openapi.py).
pub static KINDE: LazyLock<Description> =
    LazyLock::new(|| Description::load("Kinde", include_str!("../../testdata/openapi/kinde.json")));

/// Lemon Squeezy's API, which publishes no description: the routes the project calls, written
/// from Lemon Squeezy's API reference (the pages are named in the file).
pub static LEMONSQUEEZY: LazyLock<Description> = LazyLock::new(|| {
    Description::load(
        "Lemon Squeezy",
        include_str!("../../testdata/openapi/lemonsqueezy.json"),
    )
});

/// One provider's API description, its `$ref`s resolved.
pub struct Description {
    name: &'static str,
    /// OpenAPI 3.0 schemas are judged as JSON Schema draft 4, 3.1's as 2020-12.
    draft: jsonschema::Draft,
    /// Each path template, split into segments (`None` for a `{parameter}`), and its item.
    routes: Vec<(String, Vec<Option<String>>, Value)>,
    /// Each schema's validator, built once: building one per request made a checked request
    /// slower than a simulation's 100 ms client timeout (Polar's ingest schema, in a debug
    /// build on a loaded machine).
    built: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

impl Description {
    fn load(name: &'static str, text: &str) -> Self {
        let doc: Value = serde_json::from_str(text).expect("an API description is JSON");
        let draft = match doc.get("openapi").and_then(Value::as_str) {
            Some(v) if v.starts_with("3.0") => jsonschema::Draft::Draft4,
            _ => jsonschema::Draft::Draft202012,
        };
        let paths = doc
            .get("paths")
            .and_then(Value::as_object)
            .expect("an API description has paths");
        let routes = paths
            .iter()
            .map(|(template, item)| {
                (
                    template.clone(),
                    segments(template),
                    resolved(item, &doc, 0),
                )
            })
            .collect();
        Self {
            name,
            draft,
            routes,
            built: Mutex::default(),
        }
    }

    /// What the description refuses of `request`, one sentence each; empty when it conforms.
    pub fn refusals(&self, request: &Request) -> Vec<String> {
        let path = request.url.path();
        let method = request.method.as_str();
        let Some((template, params, operation)) = self.operation(method, path) else {
            let known = self
                .routes
                .iter()
                .any(|(_, segments, _)| matches(segments, path));
            return vec![if known {
                format!("{} describes no {} on this path", self.name, request.method)
            } else {
                format!("{} describes no such path", self.name)
            }];
        };
        let mut faults = Vec::new();
        self.check_path(template, &params, path, &mut faults);
        self.check_query(&params, request, &mut faults);
        self.check_body(operation, request, &mut faults);
        faults
    }

    /// The operation `method` `path` names: its template, its parameters (the path item's,
    /// overridden by the operation's own of the same name and place), and the operation.
    fn operation(&self, method: &str, path: &str) -> Option<(&str, Vec<Value>, &Value)> {
        let (template, _, item) = self
            .routes
            .iter()
            .filter(|(_, segments, _)| matches(segments, path))
            // A literal segment is a better match than a parameter (`/v1/subscriptions/search`
            // before `/v1/subscriptions/{id}`).
            .max_by_key(|(_, segments, _)| segments.iter().filter(|s| s.is_some()).count())?;
        let operation = item.get(method.to_ascii_lowercase())?;
        let mut params: Vec<Value> = Vec::new();
        let listed = |v: &Value| v.get("parameters").and_then(Value::as_array).cloned();
        for p in listed(operation).into_iter().chain(listed(item)).flatten() {
            let same = |q: &Value| q.get("name") == p.get("name") && q.get("in") == p.get("in");
            if !params.iter().any(same) {
                params.push(p);
            }
        }
        Some((template, params, operation))
    }

    fn check_path(&self, template: &str, params: &[Value], path: &str, faults: &mut Vec<String>) {
        for (name, value) in template.split('/').zip(path.split('/')) {
            let Some(name) = name.strip_prefix('{').and_then(|n| n.strip_suffix('}')) else {
                continue;
            };
            let described = params.iter().find(|p| {
                p.get("in").and_then(Value::as_str) == Some("path")
                    && p.get("name").and_then(Value::as_str) == Some(name)
            });
            if let Some(schema) = described.and_then(|p| p.get("schema")) {
                let value = self.coerce(&Value::String(value.to_owned()), schema);
                self.judge(&format!("path parameter `{name}`"), schema, &value, faults);
            }
        }
    }

    fn check_query(&self, params: &[Value], request: &Request, faults: &mut Vec<String>) {
        let query: Vec<&Value> = params
            .iter()
            .filter(|p| p.get("in").and_then(Value::as_str) == Some("query"))
            .collect();
        let name_of = |p: &Value| p.get("name").and_then(Value::as_str).map(str::to_owned);
        let mut given: Vec<(String, Value)> = Vec::new();
        for (key, value) in request.url.query_pairs() {
            let (base, segments) = bracketed(&key);
            if !query.iter().any(|p| name_of(p).as_deref() == Some(base)) {
                faults.push(format!(
                    "query parameter `{key}` is not one the operation takes"
                ));
                continue;
            }
            let at = match given.iter().position(|(n, _)| n == base) {
                Some(at) => at,
                None => {
                    given.push((base.to_owned(), Value::Null));
                    given.len() - 1
                }
            };
            insert(&mut given[at].1, &segments, value.into_owned());
        }
        for p in query {
            let Some(name) = name_of(p) else { continue };
            let schema = p.get("schema").cloned().unwrap_or(Value::Bool(true));
            let Some((_, value)) = given.iter().find(|(n, _)| *n == name) else {
                if p.get("required").and_then(Value::as_bool) == Some(true) {
                    faults.push(format!("required query parameter `{name}` is missing"));
                }
                continue;
            };
            // An array in the `form` style: repeated (`explode`, the default), or one
            // comma-separated value (`explode: false`).
            let value = match (value, takes_array(&schema)) {
                (Value::String(s), true) => {
                    if p.get("explode").and_then(Value::as_bool) == Some(false) {
                        Value::Array(s.split(',').map(|v| Value::String(v.into())).collect())
                    } else {
                        Value::Array(vec![value.clone()])
                    }
                }
                _ => value.clone(),
            };
            let value = self.coerce(&value, &schema);
            self.judge(
                &format!("query parameter `{name}`"),
                &schema,
                &value,
                faults,
            );
        }
    }

    fn check_body(&self, operation: &Value, request: &Request, faults: &mut Vec<String>) {
        let described = operation.get("requestBody");
        if request.body.is_empty() {
            let required = described
                .and_then(|b| b.get("required"))
                .and_then(Value::as_bool);
            if required == Some(true) {
                faults.push("the operation requires a body and none was sent".into());
            }
            return;
        }
        let Some(content) = described.and_then(|b| b.get("content")) else {
            faults.push("the operation takes no body".into());
            return;
        };
        let media = request
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let Some(schema) = content
            .get(&media)
            .map(|m| m.get("schema").unwrap_or(&Value::Null))
        else {
            faults.push(format!("the operation takes no body of type `{media}`"));
            return;
        };
        let body = match media.as_str() {
            "application/x-www-form-urlencoded" => {
                let mut body = Value::Object(Map::new());
                for (key, value) in url::form_urlencoded::parse(&request.body) {
                    let (base, mut segments) = bracketed(&key);
                    segments.insert(0, base.to_owned());
                    insert(&mut body, &segments, value.into_owned());
                }
                body
            }
            _ => match serde_json::from_slice(&request.body) {
                Ok(body) => body,
                Err(e) => {
                    faults.push(format!("the body is not JSON: {e}"));
                    return;
                }
            },
        };
        let body = self.coerce(&body, schema);
        self.judge("the body", schema, &body, faults);
    }

    /// `value` read as the types `schema` asks for: a form or query value arrives as text.
    fn coerce(&self, value: &Value, schema: &Value) -> Value {
        for key in ["anyOf", "oneOf"] {
            if let Some(branches) = schema.get(key).and_then(Value::as_array) {
                return branches
                    .iter()
                    .map(|b| self.coerce(value, b))
                    .zip(branches)
                    .find(|(v, b)| self.is_valid(b, v))
                    .map(|(v, _)| v)
                    .unwrap_or_else(|| value.clone());
            }
        }
        if let Some(branches) = schema.get("allOf").and_then(Value::as_array) {
            return branches
                .iter()
                .fold(value.clone(), |v, b| self.coerce(&v, b));
        }
        match value {
            Value::String(text) => match type_of(schema) {
                Some("integer") => text.parse::<i64>().map(Value::from).ok(),
                Some("number") => text.parse::<f64>().ok().map(Value::from),
                Some("boolean") => text.parse::<bool>().ok().map(Value::Bool),
                _ => None,
            }
            .unwrap_or_else(|| value.clone()),
            Value::Object(members) => Value::Object(
                members
                    .iter()
                    .map(|(k, v)| {
                        let member = schema
                            .pointer(&format!(
                                "/properties/{}",
                                k.replace('~', "~0").replace('/', "~1")
                            ))
                            .or_else(|| {
                                schema.get("additionalProperties").filter(|a| a.is_object())
                            });
                        (
                            k.clone(),
                            member.map_or_else(|| v.clone(), |m| self.coerce(v, m)),
                        )
                    })
                    .collect(),
            ),
            Value::Array(items) => match schema.get("items") {
                Some(item) => Value::Array(items.iter().map(|v| self.coerce(v, item)).collect()),
                None => value.clone(),
            },
            _ => value.clone(),
        }
    }

    /// What `schema` refuses of `value`, and the members it does not describe, as faults of
    /// `what`.
    fn judge(&self, what: &str, schema: &Value, value: &Value, faults: &mut Vec<String>) {
        let validator = match self.validator(schema) {
            Ok(validator) => validator,
            Err(e) => {
                faults.push(format!(
                    "{what}: the description's schema does not compile: {e}"
                ));
                return;
            }
        };
        for error in validator.iter_errors(value) {
            // Said below, by the parameter's own name.
            if matches!(
                error.kind(),
                jsonschema::error::ValidationErrorKind::AdditionalProperties { .. }
            ) {
                continue;
            }
            let at = error.instance_path().to_string();
            faults.push(format!(
                "{what}{}: {error}",
                if at.is_empty() {
                    String::new()
                } else {
                    format!(" at {at}")
                }
            ));
        }
        let mut undescribed = Vec::new();
        self.undescribed(schema, value, "", &mut undescribed);
        for at in undescribed {
            faults.push(format!(
                "{what}: `{at}` is not a parameter the operation takes"
            ));
        }
    }

    /// The members of `value` that no `properties` of `schema` name, where it lists them.
    fn undescribed(&self, schema: &Value, value: &Value, at: &str, found: &mut Vec<String>) {
        for key in ["anyOf", "oneOf"] {
            if let Some(branches) = schema.get(key).and_then(Value::as_array) {
                // The branch the value is (none: the schema's own errors say so).
                if let Some(b) = branches.iter().find(|b| self.is_valid(b, value)) {
                    self.undescribed(b, value, at, found);
                }
                return;
            }
        }
        if schema.get("allOf").is_some() {
            return;
        }
        let name = |k: &str| match at {
            "" => k.to_owned(),
            _ => format!("{at}[{k}]"),
        };
        match value {
            Value::Object(members) => {
                let properties = schema.get("properties").and_then(Value::as_object);
                let others = schema.get("additionalProperties");
                for (k, v) in members {
                    match (properties.and_then(|p| p.get(k)), others) {
                        (Some(member), _) => self.undescribed(member, v, &name(k), found),
                        (None, Some(other)) if other.is_object() => {
                            self.undescribed(other, v, &name(k), found)
                        }
                        (None, Some(Value::Bool(true))) => {}
                        (None, None) if properties.is_none() => {}
                        // Not listed, and `additionalProperties` absent or `false`.
                        (None, _) => found.push(name(k)),
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item) = schema.get("items") {
                    for (i, v) in items.iter().enumerate() {
                        self.undescribed(item, v, &format!("{at}[{i}]"), found);
                    }
                }
            }
            _ => {}
        }
    }

    fn validator(&self, schema: &Value) -> Result<Arc<jsonschema::Validator>, String> {
        let key = schema.to_string();
        if let Some(built) = self
            .built
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(built.clone());
        }
        let built = jsonschema::options()
            .with_draft(self.draft)
            .build(schema)
            .map(Arc::new)
            .map_err(|e| e.to_string())?;
        self.built
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, built.clone());
        Ok(built)
    }

    fn is_valid(&self, schema: &Value, value: &Value) -> bool {
        self.validator(schema).is_ok_and(|v| v.is_valid(value))
    }
}

/// A path template's segments, `None` for a `{parameter}`.
fn segments(template: &str) -> Vec<Option<String>> {
    template
        .split('/')
        .map(|s| {
            let parameter = s.starts_with('{') && s.ends_with('}');
            (!parameter).then(|| s.to_owned())
        })
        .collect()
}

/// Whether `path` fits a template's segments.
fn matches(segments: &[Option<String>], path: &str) -> bool {
    let given: Vec<&str> = path.split('/').collect();
    given.len() == segments.len()
        && segments.iter().zip(&given).all(|(s, g)| match s {
            Some(literal) => literal == g,
            None => !g.is_empty(),
        })
}

/// A form key's name and its bracketed segments: `payload[value]` is `payload`, `[value]`;
/// `types[]` is `types`, `[""]`.
fn bracketed(key: &str) -> (&str, Vec<String>) {
    match key.split_once('[') {
        None => (key, Vec::new()),
        Some((base, rest)) => {
            let segments = rest
                .trim_end_matches(']')
                .split("][")
                .map(str::to_owned)
                .collect();
            (base, segments)
        }
    }
}

/// Puts `value` at `segments` under `slot`: a name opens an object, `[]` or an index an array.
fn insert(slot: &mut Value, segments: &[String], value: String) {
    let Some((first, rest)) = segments.split_first() else {
        match slot {
            Value::Null => *slot = Value::String(value),
            Value::Array(items) => items.push(Value::String(value)),
            other => *other = Value::Array(vec![other.take(), Value::String(value)]),
        }
        return;
    };
    let index = first.parse::<usize>().ok();
    if first.is_empty() || index.is_some() {
        if !slot.is_array() {
            *slot = Value::Array(Vec::new());
        }
        let Value::Array(items) = slot else { return };
        let at = match index {
            Some(i) => i,
            None if rest.is_empty() => items.len(),
            None => items.len(),
        };
        while items.len() <= at {
            items.push(Value::Null);
        }
        insert(&mut items[at], rest, value);
    } else {
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        let Value::Object(members) = slot else { return };
        insert(
            members.entry(first.clone()).or_insert(Value::Null),
            rest,
            value,
        );
    }
}

/// Whether a parameter's schema takes an array: its own type, or one of its `anyOf`/`oneOf`
/// branches' (OpenAPI 3.1's optional list is `anyOf: [{type: array}, {type: null}]`).
fn takes_array(schema: &Value) -> bool {
    let branches = ["anyOf", "oneOf"]
        .iter()
        .filter_map(|k| schema.get(*k).and_then(Value::as_array))
        .flatten();
    type_of(schema) == Some("array") || branches.into_iter().any(takes_array)
}

/// A schema's type: `type`, or the first of a list that is not `"null"` (OpenAPI 3.1).
fn type_of(schema: &Value) -> Option<&str> {
    match schema.get("type")? {
        Value::String(t) => Some(t),
        Value::Array(types) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null"),
        _ => None,
    }
}

/// `node` with every local `$ref` replaced by what it points at (a reference cycle is left
/// open past a depth no request schema reaches).
fn resolved(node: &Value, doc: &Value, depth: usize) -> Value {
    match node {
        Value::Object(members) => {
            if let Some(target) = members
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix('#'))
                .filter(|_| depth < 32)
                .and_then(|pointer| doc.pointer(pointer))
            {
                return resolved(target, doc, depth + 1);
            }
            Value::Object(
                members
                    .iter()
                    .map(|(k, v)| (k.clone(), resolved(v, doc, depth)))
                    .collect(),
            )
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| resolved(v, doc, depth)).collect())
        }
        other => other.clone(),
    }
}

/// Where a fake's own routes are (what it is told to hold, by `inboxctl`): no provider has
/// them, so they are not checked against its description.
pub const ADMIN: &str = "/_fake/";

/// A test's stand-in for a provider's API: a wiremock server whose every request is checked
/// against the provider's description as it arrives. Dropped at the end of the test, it fails
/// the test with what the description refused, if anything.
pub struct ProviderServer {
    server: MockServer,
    description: &'static Description,
    refused: Arc<Mutex<Vec<String>>>,
}

impl ProviderServer {
    pub async fn start(description: &'static Description) -> Self {
        let provider = Self {
            server: MockServer::start().await,
            description,
            refused: Arc::default(),
        };
        provider.watch().await;
        provider
    }

    /// A provider server on `listener` (a fixed port: `inboxctl fakes`), checked the same way.
    pub async fn listening(description: &'static Description, listener: TcpListener) -> Self {
        let provider = Self {
            server: MockServer::builder().listener(listener).start().await,
            description,
            refused: Arc::default(),
        };
        provider.watch().await;
        provider
    }

    /// What the description refused since the last call, taken: a long-running server says
    /// each refusal once, as it comes.
    pub fn take_refused(&self) -> Vec<String> {
        std::mem::take(&mut *self.refused.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Forgets the mounted answers, as `MockServer::reset` does, and goes on checking.
    pub async fn reset(&self) {
        self.server.reset().await;
        self.watch().await;
    }

    /// What the description refused of the requests so far.
    pub fn refused(&self) -> Vec<String> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every request meets this first (the highest priority) and is checked; it matches none,
    /// so the test's own mounts answer.
    async fn watch(&self) {
        Mock::given(Checked {
            description: self.description,
            refused: self.refused.clone(),
        })
        .respond_with(ResponseTemplate::new(500))
        .with_priority(1)
        .named("checked against the provider's API description")
        .mount(&self.server)
        .await;
    }
}

impl Deref for ProviderServer {
    type Target = MockServer;

    fn deref(&self) -> &MockServer {
        &self.server
    }
}

impl Drop for ProviderServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let refused = self.refused();
        assert!(
            refused.is_empty(),
            "{} would refuse requests this test sent:\n{}",
            self.description.name,
            refused.join("\n")
        );
    }
}

struct Checked {
    description: &'static Description,
    refused: Arc<Mutex<Vec<String>>>,
}

impl Match for Checked {
    fn matches(&self, request: &Request) -> bool {
        if request.url.path().starts_with(ADMIN) {
            return false;
        }
        let faults = self.description.refusals(request);
        if !faults.is_empty() {
            let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
            let url = &request.url;
            let target = match url.query() {
                Some(query) => format!("{}?{query}", url.path()),
                None => url.path().to_owned(),
            };
            for fault in faults {
                refused.push(format!("{} {target}: {fault}", request.method));
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, url: &str, form: &str) -> Request {
        let mut headers = http::HeaderMap::new();
        if !form.is_empty() {
            headers.insert(
                "content-type",
                "application/x-www-form-urlencoded".parse().unwrap(),
            );
        }
        Request {
            url: url::Url::parse(&format!("http://127.0.0.1{url}")).unwrap(),
            method: method.parse().unwrap(),
            headers,
            body: form.as_bytes().to_vec(),
        }
    }

    fn refused(method: &str, url: &str, form: &str) -> Vec<String> {
        STRIPE.refusals(&request(method, url, form))
    }

    const EVENT: &str = "event_name=api_calls&identifier=mr_1&timestamp=1700000000\
                         &payload[stripe_customer_id]=cus_1&payload[value]=3";

    #[test]
    fn a_meter_event_as_the_project_sends_it_is_taken() {
        assert_eq!(
            refused("POST", "/v1/billing/meter_events", EVENT),
            Vec::<String>::new()
        );
    }

    #[test]
    fn an_unknown_path_or_method_is_refused() {
        assert_eq!(
            refused("GET", "/v1/billing/meter_things", ""),
            ["Stripe describes no such path"]
        );
        assert_eq!(
            refused("DELETE", "/v1/billing/meters", ""),
            ["Stripe describes no DELETE on this path"]
        );
    }

    /// The object reads a thin event, a refund and a health notice make are checked as every
    /// other request is: taken as the project sends them, refused with a parameter Stripe
    /// does not know.
    #[test]
    fn the_object_reads_of_thin_events_refunds_and_notices_are_checked() {
        for url in [
            "/v1/customers/cus_1",
            "/v1/payment_intents/pi_1",
            "/v1/charges/ch_1",
            "/v2/core/events/evt_1",
        ] {
            assert_eq!(refused("GET", url, ""), Vec::<String>::new(), "{url}");
            assert!(
                !refused("GET", &format!("{url}?colour=blue"), "").is_empty(),
                "{url} with an unknown parameter"
            );
        }
        assert!(!refused("DELETE", "/v2/core/events/evt_1", "").is_empty());
    }

    #[test]
    fn an_unknown_form_parameter_is_refused_at_any_depth() {
        let faults = refused(
            "POST",
            "/v1/billing/meter_events",
            &format!("{EVENT}&value=3"),
        );
        assert_eq!(
            faults,
            ["the body: `value` is not a parameter the operation takes"],
            "{faults:?}"
        );
        let cancel = "event_name=api_calls&type=cancel&cancel[identifier]=mr_1&cancel[at]=1";
        let faults = refused("POST", "/v1/billing/meter_event_adjustments", cancel);
        assert_eq!(
            faults,
            ["the body: `cancel[at]` is not a parameter the operation takes"],
            "{faults:?}"
        );
    }

    #[test]
    fn a_missing_required_parameter_or_a_wrong_type_or_value_is_refused() {
        let faults = refused(
            "POST",
            "/v1/billing/meter_events",
            "identifier=mr_1&timestamp=soon&payload[value]=3",
        );
        assert!(
            faults
                .iter()
                .any(|f| f.contains("\"event_name\" is a required property")),
            "{faults:?}"
        );
        assert!(
            faults
                .iter()
                .any(|f| f.contains("/timestamp") && f.contains("integer")),
            "{faults:?}"
        );
        let faults = refused("GET", "/v1/billing/meters?status=all&limit=100", "");
        assert!(
            faults
                .iter()
                .any(|f| f.starts_with("query parameter `status`")),
            "{faults:?}"
        );
        let faults = refused(
            "GET",
            "/v1/billing/meters/mtr_1/event_summaries?customer=cus_1&start_time=60",
            "",
        );
        assert_eq!(
            faults,
            ["required query parameter `end_time` is missing"],
            "{faults:?}"
        );
        let faults = refused("GET", "/v1/billing/meters?limit=100&types[]=a", "");
        assert_eq!(
            faults,
            ["query parameter `types[]` is not one the operation takes"],
            "{faults:?}"
        );
    }

    #[test]
    fn paddle_takes_its_comma_separated_lists_and_refuses_what_they_do_not_list() {
        let fine = request(
            "GET",
            "/notifications?status=failed,needs_retry&from=2026-01-01T00:00:00Z&order_by=id[asc]&per_page=200",
            "",
        );
        assert_eq!(PADDLE.refusals(&fine), Vec::<String>::new());
        let wrong = request("GET", "/notifications?status=failed,retrying", "");
        let faults = PADDLE.refusals(&wrong);
        assert!(
            faults
                .iter()
                .any(|f| f.starts_with("query parameter `status` at /1")),
            "{faults:?}"
        );
    }

    #[tokio::test]
    async fn a_test_whose_provider_server_was_sent_a_refused_request_fails() {
        let server = ProviderServer::start(&STRIPE).await;
        Mock::given(wiremock::matchers::any())
            .respond_with(ResponseTemplate::new(200))
            .mount(&server)
            .await;
        let answer = reqwest::Client::new()
            .post(format!("{}/v1/billing/meter_events", server.uri()))
            .form(&[
                ("event_name", "api_calls"),
                ("payload[value]", "3"),
                ("value", "3"),
            ])
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "the test's own mount answers");
        assert_eq!(
            server.refused(),
            ["POST /v1/billing/meter_events: the body: `value` is not a parameter the operation takes"]
        );
        let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(server)));
        let message = dropped.expect_err("dropping it fails the test");
        let message = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(
            message.starts_with("Stripe would refuse requests this test sent"),
            "{message}"
        );
    }
}
