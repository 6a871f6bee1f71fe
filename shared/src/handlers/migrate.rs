//! The migrate function's handler: the `Custom::SchemaMigrations` resource of the stack
//! (docs/design.md §7.1). CloudFormation sends Create or Update on every deploy that ships new
//! code; each applies the migrations the database lacks ([`crate::platform::schema::apply`]) and answers
//! SUCCESS, or FAILED with the reason, which fails the deploy and shows in the stack's events.
//! Delete never touches the database: deleting the stack keeps the data. The answer is a PUT
//! to the request's presigned `ResponseURL`, before the invocation's deadline whatever
//! happens: CloudFormation waits for it (up to the resource's `ServiceTimeout`).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use aws_lambda_events::event::cloudformation::{
    CloudFormationCustomResourceRequest as Request, CloudFormationCustomResourceResponse,
    CloudFormationCustomResourceResponseStatus as Status,
};
use serde_json::Value;
use sqlx::{ConnectOptions, Connection, PgConnection};
use tokio::time::Instant;

use crate::platform::config::ConfigError;
use crate::platform::config::DatabaseConfig;
use crate::platform::database::Database;
use crate::platform::http_client::LazyClient;
use crate::platform::presented_chain::presented_issuer;
use crate::platform::schema::{self, Applied};

/// The resource's one physical id: the same on every Create and Update, so that
/// CloudFormation never takes an answer for a replacement (which it would follow with a
/// Delete of the old id).
pub const PHYSICAL_ID: &str = "billing-inbox-schema";
/// CloudFormation's limit on the whole response body.
pub const MAX_BODY_BYTES: usize = 4096;
/// What the function keeps for the answer at the end of its invocation: cancelling a running
/// migration ([`CANCEL_BUDGET`], 10 s) and the PUT with its retries (4 × 10 s + 7 s).
pub const DEFAULT_MARGIN: Duration = Duration::from_secs(60);
/// How long a connection may take: an Aurora Serverless database resuming from zero
/// capacity answers in about 15 s.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// One PUT of the answer.
const PUT_TIMEOUT: Duration = Duration::from_secs(10);
/// The waits before the PUT's next attempts, after a failed one.
pub const PUT_RETRY_DELAYS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// The database's options, built on first use: a secret that cannot be read is a FAILED
/// answer naming it, not a function that cannot start (which CloudFormation would only see as
/// silence). A failed read is tried again at the next request.
pub struct MigrateState {
    config: Result<DatabaseConfig, ConfigError>,
    database: tokio::sync::OnceCell<Arc<Database>>,
    client: LazyClient,
    /// Time kept for the answer before the deadline ([`DEFAULT_MARGIN`]).
    pub margin: Duration,
    pub connect_timeout: Duration,
    pub retry_delays: Vec<Duration>,
}

impl MigrateState {
    /// The state of `config`, which is read from the environment at cold start; its error, if
    /// any, is every request's reason.
    pub fn new(config: Result<DatabaseConfig, ConfigError>) -> Self {
        Self {
            config,
            database: tokio::sync::OnceCell::new(),
            client: LazyClient::with_timeout(PUT_TIMEOUT),
            margin: DEFAULT_MARGIN,
            connect_timeout: CONNECT_TIMEOUT,
            retry_delays: PUT_RETRY_DELAYS.to_vec(),
        }
    }

    /// A state on options opened already (tests, tools).
    pub fn on(database: Arc<Database>) -> Self {
        let state = Self::new(Ok(DatabaseConfig::url("")));
        state.database.set(database).expect("a new cell is empty");
        state
    }

    async fn database(&self) -> Result<&Arc<Database>, String> {
        let config = self.config.as_ref().map_err(|e| e.to_string())?;
        self.database
            .get_or_try_init(|| Database::open(config))
            .await
            .map_err(|e| e.to_string())
    }
}

/// What the request asked, in the fields every request type has.
struct Asked {
    kind: &'static str,
    response_url: String,
    stack_id: String,
    request_id: String,
    logical_resource_id: String,
    /// The id the answer gives: Delete echoes the request's.
    physical_resource_id: String,
}

/// The answer's status, reason and data.
struct Outcome {
    status: Status,
    reason: Option<String>,
    data: HashMap<String, String>,
}

impl Outcome {
    fn success(data: HashMap<String, String>) -> Self {
        Self {
            status: Status::Success,
            reason: None,
            data,
        }
    }

    fn failed(reason: impl Into<String>) -> Self {
        Self {
            status: Status::Failed,
            reason: Some(reason.into()),
            data: HashMap::new(),
        }
    }
}

/// Handles one request and answers it at its `ResponseURL`. Returns an error only when the
/// answer could not be delivered (CloudFormation then waits for its `ServiceTimeout`), or
/// when the event is no custom-resource request at all (there is nowhere to answer).
pub async fn handle(
    state: &MigrateState,
    event: Value,
    deadline: Option<Instant>,
) -> Result<(), anyhow::Error> {
    let started = Instant::now();
    let request = serde_json::from_value::<Request>(event.clone());
    let (asked, outcome) = match request.as_ref().map(asked) {
        Ok(Some(asked)) => {
            let request = request.as_ref().expect("matched Ok");
            let outcome = match &request {
                Request::Delete(_) => {
                    tracing::info!(
                        "delete: the schema and its data stay (the database is not touched)"
                    );
                    Outcome::success(HashMap::new())
                }
                Request::Update(update)
                    if is_rollback(
                        &update.resource_properties,
                        &update.old_resource_properties,
                    ) =>
                {
                    tracing::info!(
                        "update back to an older release (a rollback): the schema stays as it is; \
                         migrations are forward-only"
                    );
                    Outcome::success(HashMap::from([(
                        "Skipped".to_owned(),
                        "rollback to an older release".to_owned(),
                    )]))
                }
                // Boxed: the migrator's future is deep enough to exceed the compiler's
                // layout depth inside the runtime's.
                _ => Box::pin(migrate(state, deadline, started)).await,
            };
            (asked, outcome)
        }
        // Not a request this function understands: answered FAILED when it says where, so
        // that the deploy fails now instead of waiting.
        unreadable => {
            let error = match unreadable {
                Err(error) => error.to_string(),
                Ok(_) => "a request type this function does not know".to_owned(),
            };
            let Some(asked) = asked_loosely(&event) else {
                anyhow::bail!("the event is not a CloudFormation custom resource request: {error}");
            };
            let reason = format!("the request could not be read: {error}");
            (asked, Outcome::failed(reason))
        }
    };
    match &outcome.reason {
        None => tracing::info!(request = asked.kind, status = "SUCCESS", data = ?outcome.data,
            elapsed_ms = started.elapsed().as_millis() as u64, "answering"),
        Some(reason) => tracing::error!(request = asked.kind, status = "FAILED", %reason,
            elapsed_ms = started.elapsed().as_millis() as u64, "answering"),
    }
    respond(state, &asked, outcome).await
}

/// Create and Update: connect, apply, say what was applied; within the deadline.
async fn migrate(state: &MigrateState, deadline: Option<Instant>, started: Instant) -> Outcome {
    let database = match state.database().await {
        Ok(database) => database,
        Err(detail) => return Outcome::failed(format!("the database's settings: {detail}")),
    };
    // The migrating connection's server process, once known: what is cancelled at the deadline.
    let pid = OnceLock::new();
    let run = run(state, database, &pid);
    let result = match deadline.and_then(|d| d.checked_sub(state.margin)) {
        Some(until) => match tokio::time::timeout_at(until, run).await {
            Ok(result) => result,
            Err(_) => {
                // The future is dropped: its connection is closed without a word to the
                // server, which would finish the running migration before noticing.
                let cancelled = match pid.get() {
                    Some(&pid) => cancel(database, pid).await,
                    None => "it was still connecting".to_owned(),
                };
                return Outcome::failed(format!(
                    "timed out after {} s (the function's deadline less {} s for this answer): \
                     {cancelled}; the migrations before it stay applied (each commits on its \
                     own), and the next deploy resumes from it",
                    started.elapsed().as_secs(),
                    state.margin.as_secs()
                ));
            }
        },
        None => run.await,
    };
    match result {
        Ok(applied) => {
            tracing::info!(
                applied = ?applied.now.iter().map(|m| m.version).collect::<Vec<_>>(),
                total = applied.total,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "migrations applied"
            );
            Outcome::success(data(&applied))
        }
        Err(reason) => Outcome::failed(reason),
    }
}

async fn run(
    state: &MigrateState,
    database: &Database,
    pid: &OnceLock<i32>,
) -> Result<Applied, String> {
    let mut conn = connect(state, database).await?;
    let backend = schema::backend_pid(&mut conn)
        .await
        .map_err(|e| format!("the database: {}", schema::database_message(&e)))?;
    let _ = pid.set(backend);
    let applied = schema::apply(&mut conn).await.map_err(|e| e.to_string());
    // Closing ends the session and so its advisory lock, held still after a failure.
    let _ = conn.close().await;
    applied
}

/// A connection of its own (a pool would test and keep it for nothing), read again once
/// after a refused login, as the other functions do after a rotation.
async fn connect(state: &MigrateState, database: &Database) -> Result<PgConnection, String> {
    let attempt = || async {
        tokio::time::timeout(state.connect_timeout, database.options().connect())
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
    };
    let generation = database.generation();
    let conn = match attempt().await {
        Err(error) if database.after_connect_error(&error, generation).await => attempt().await,
        other => other,
    };
    let error = match conn {
        Ok(conn) => return Ok(conn),
        Err(error) => error,
    };
    let options = database.options();
    let mut what = match &error {
        sqlx::Error::PoolTimedOut => {
            format!("no answer within {} s", state.connect_timeout.as_secs())
        }
        error => schema::database_message(error),
    };
    if refused_certificate(&error) {
        // A refused chain's message names no issuer: read the one the server presents.
        if let Some(issuer) = presented_issuer(options.get_host(), options.get_port()).await {
            what.push_str(&format!(
                "; the server's certificate chains to '{issuer}', which none of the roots it \
                 is checked against is (the carried roots, or the bundle DATABASE_CA_FILE \
                 names: docs/deploy.md, The database's secret and TLS)"
            ));
        }
    }
    // The host and port, never the user's password (the options are not printed).
    Err(format!(
        "cannot connect to the database at {}:{}: {what}",
        options.get_host(),
        options.get_port()
    ))
}

/// Whether the handshake refused the server's certificate: rustls's error, which sqlx passes
/// on as an I/O error of the connection.
fn refused_certificate(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Tls(_) => true,
        sqlx::Error::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .is_some_and(|tls| matches!(tls, rustls::Error::InvalidCertificate(_))),
        _ => false,
    }
}

/// How long cancelling an abandoned run may take, its connection included.
const CANCEL_BUDGET: Duration = Duration::from_secs(10);

/// Cancels the abandoned run from a new connection and waits for its server process to end
/// (its connection is closed already: the process rolls back and exits); says how it went
/// and which migration it was at.
async fn cancel(database: &Database, pid: i32) -> String {
    let cancelled = tokio::time::timeout(CANCEL_BUDGET, async {
        let mut conn = database.options().connect().await?;
        let signalled = schema::cancel(&mut conn, pid).await?;
        while signalled && schema::is_running(&mut conn, pid).await? {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let applied = schema::applied(&mut conn).await.ok();
        let _ = conn.close().await;
        Ok::<_, sqlx::Error>(applied)
    })
    .await;
    let applied = match cancelled {
        Ok(Ok(applied)) => applied,
        Ok(Err(error)) => {
            return format!(
                "its cancel failed ({}); the server rolls it back when it finds the connection closed",
                schema::database_message(&error)
            )
        }
        Err(_) => {
            return format!(
                "its cancel was not confirmed within {} s; the server rolls it back when it finds the connection closed",
                CANCEL_BUDGET.as_secs()
            )
        }
    };
    let Some(applied) = applied else {
        return "it was cancelled and rolled back".to_owned();
    };
    match schema::next(&applied) {
        None => "it was cancelled after every migration was applied".to_owned(),
        Some(next) if next.no_tx => format!(
            "migration {} ({}), which it was running or waiting for, was cancelled; it runs \
             outside a transaction (no-transaction), so what it did stays: see its file",
            next.version, next.description
        ),
        Some(next) => format!(
            "migration {} ({}), which it was running or waiting for, was cancelled and rolled back",
            next.version, next.description
        ),
    }
}

/// The answer's Data: what `!GetAtt SchemaMigrations.LatestVersion` and the others give.
fn data(applied: &Applied) -> HashMap<String, String> {
    let mut data = HashMap::from([
        ("Applied".to_owned(), applied.now.len().to_string()),
        ("Total".to_owned(), applied.total.to_string()),
    ]);
    if let Some(latest) = &applied.latest {
        data.insert("LatestVersion".to_owned(), latest.version.to_string());
        data.insert("LatestDescription".to_owned(), latest.description.clone());
    }
    data
}

/// Whether an Update goes back to an older published version of the function: the rollback
/// of a failed deploy. Its migrations are not undone (they are forward-only, and the older
/// code runs on the newer schema), and running the newer migrations again would only fail
/// the rollback too. `CodeVersion` is the version's ARN, ending in its number.
fn is_rollback(new: &Value, old: &Value) -> bool {
    let number = |properties: &Value| {
        properties
            .get("CodeVersion")
            .and_then(Value::as_str)
            .and_then(|arn| arn.rsplit(':').next())
            .and_then(|n| n.parse::<u64>().ok())
    };
    matches!((number(new), number(old)), (Some(new), Some(old)) if new < old)
}

/// `None`: a request type added to `aws_lambda_events` after this was written.
fn asked(request: &Request) -> Option<Asked> {
    Some(match request {
        Request::Create(r) => Asked {
            kind: "Create",
            response_url: r.response_url.clone(),
            stack_id: r.stack_id.clone(),
            request_id: r.request_id.clone(),
            logical_resource_id: r.logical_resource_id.clone(),
            physical_resource_id: PHYSICAL_ID.to_owned(),
        },
        Request::Update(r) => Asked {
            kind: "Update",
            response_url: r.response_url.clone(),
            stack_id: r.stack_id.clone(),
            request_id: r.request_id.clone(),
            logical_resource_id: r.logical_resource_id.clone(),
            physical_resource_id: PHYSICAL_ID.to_owned(),
        },
        Request::Delete(r) => Asked {
            kind: "Delete",
            response_url: r.response_url.clone(),
            stack_id: r.stack_id.clone(),
            request_id: r.request_id.clone(),
            logical_resource_id: r.logical_resource_id.clone(),
            physical_resource_id: r.physical_resource_id.clone(),
        },
        #[allow(unreachable_patterns)]
        _ => return None,
    })
}

/// The answering fields of an event that is not a request this function reads (an unknown
/// RequestType, a missing field): enough to say so.
fn asked_loosely(event: &Value) -> Option<Asked> {
    let field = |name: &str| event.get(name).and_then(Value::as_str).map(str::to_owned);
    Some(Asked {
        kind: "unreadable",
        response_url: field("ResponseURL")?,
        stack_id: field("StackId")?,
        request_id: field("RequestId")?,
        logical_resource_id: field("LogicalResourceId")?,
        physical_resource_id: field("PhysicalResourceId").unwrap_or_else(|| PHYSICAL_ID.to_owned()),
    })
}

/// The response body, its reason shortened until the whole fits CloudFormation's limit.
fn body(asked: &Asked, outcome: Outcome) -> String {
    let mut response = CloudFormationCustomResourceResponse::default();
    response.status = outcome.status;
    response.physical_resource_id = asked.physical_resource_id.clone();
    response.stack_id = asked.stack_id.clone();
    response.request_id = asked.request_id.clone();
    response.logical_resource_id = asked.logical_resource_id.clone();
    response.data = outcome.data;
    let mut reason = outcome.reason;
    loop {
        response.reason = reason.clone();
        let body = serde_json::to_string(&response).expect("strings always serialize");
        let over = body.len().saturating_sub(MAX_BODY_BYTES - 1);
        match (&mut reason, over) {
            (_, 0) | (None, _) => return body,
            (Some(text), over) => {
                // Escaping makes a character longer in JSON than in the text: cut at least
                // what is over, on a character boundary, and say it was cut.
                let mut keep = text.len().saturating_sub(over + "…".len());
                while !text.is_char_boundary(keep) {
                    keep -= 1;
                }
                text.truncate(keep);
                text.push('…');
            }
        }
    }
}

/// The response URL without its query string, which is a credential (the presigned
/// signature): what the logs may show of it.
fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(url) => format!("{}{}", url.origin().ascii_serialization(), url.path()),
        Err(_) => "(not a URL)".to_owned(),
    }
}

/// PUTs the answer, with an empty Content-Type (the presigned URL was signed without one),
/// retrying a failed attempt after each of the state's delays.
async fn respond(state: &MigrateState, asked: &Asked, outcome: Outcome) -> anyhow::Result<()> {
    let body = body(asked, outcome);
    let client = state.client.get()?;
    let mut delays = state.retry_delays.iter();
    loop {
        let sent = client
            .put(&asked.response_url)
            .header(http::header::CONTENT_TYPE, "")
            .body(body.clone())
            .send()
            .await;
        let failure = match sent {
            Ok(response) if response.status().is_success() => return Ok(()),
            Ok(response) => format!("answered {}", response.status()),
            // Without the URL: reqwest's error shows it, query string included.
            Err(error) => error.without_url().to_string(),
        };
        let Some(delay) = delays.next() else {
            anyhow::bail!(
                "the response could not be delivered to {}: {failure}",
                shown(&asked.response_url)
            );
        };
        tracing::warn!(url = %shown(&asked.response_url), %failure,
            "the response was not delivered; trying again");
        tokio::time::sleep(*delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn asked() -> Asked {
        Asked {
            kind: "Create",
            response_url: "https://bucket.s3.amazonaws.com/key?X-Amz-Signature=secret".into(),
            stack_id: "arn:aws:cloudformation:eu-west-1:123456789012:stack/inbox/guid".into(),
            request_id: "unique-id".into(),
            logical_resource_id: "SchemaMigrations".into(),
            physical_resource_id: PHYSICAL_ID.into(),
        }
    }

    #[test]
    fn a_long_reason_is_cut_so_the_body_fits_cloudformations_limit() {
        // Quotes and newlines are escaped: the JSON is longer than the text.
        let reason = "relation \"é\"\n".repeat(1_000);

        let body = body(&asked(), Outcome::failed(reason));

        assert!(body.len() < MAX_BODY_BYTES, "{}", body.len());
        let parsed: Value = serde_json::from_str(&body).unwrap();
        let reason = parsed["Reason"].as_str().unwrap();
        assert!(reason.starts_with("relation \"é\"\n") && reason.ends_with('…'));
        assert_eq!(parsed["Status"], "FAILED");
    }

    #[test]
    fn only_an_update_to_an_older_version_is_a_rollback() {
        let v = |n: u32| json!({"CodeVersion": format!("arn:aws:lambda:eu-west-1:1:function:inbox-migrate:{n}")});
        assert!(is_rollback(&v(6), &v(7)));
        assert!(!is_rollback(&v(8), &v(7)));
        assert!(!is_rollback(&v(7), &v(7)));
        assert!(!is_rollback(&json!({}), &v(7)));
    }

    #[test]
    fn the_logs_show_the_response_url_without_its_signature() {
        assert_eq!(
            shown(&asked().response_url),
            "https://bucket.s3.amazonaws.com/key"
        );
    }
}
