//! How the functions log in to their database (docs/design.md §5.3): the connection options
//! of what the configuration names ([`DatabaseConfig`]) — `DATABASE_URL` (local use and
//! tests), or the Secrets Manager secret `DATABASE_SECRET_ID` names, a URL string or the JSON
//! RDS keeps (`username`, `password`, `host`, `port`, `dbname`) — read once per cold start, and
//! read again once after the database refuses the login, so that a rotated password needs no
//! redeploy. `DATABASE_TLS` says how the server is checked: a secret's connections are
//! `verify-full` unless it says otherwise, against the roots the library carries
//! ([`AWS_DATABASE_ROOTS`]: RDS's and RDS Proxy's) or the bundle `DATABASE_CA_FILE` names; a
//! `DATABASE_URL` keeps what the URL says. With `DATABASE_POOLER=transaction` no statement is
//! named ([`crate::platform::db::exec`]).

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool};

use crate::platform::config::{
    ConfigError, DatabaseConfig, DatabaseSource, Endpoint, Pooler, DATABASE_CA_VAR,
    DATABASE_HOST_VAR, DATABASE_SECRET_VAR, DATABASE_URL_VAR,
};

/// How long one read of the database's secret may take: a connection attempt waits on it.
const READ_BUDGET: Duration = Duration::from_secs(3);
/// The least time between two reads of the secret after refused logins: a secret that is
/// wrong, not rotated, is not read again at every connection attempt.
pub const REREAD_INTERVAL: Duration = Duration::from_secs(30);

/// The roots a verifying connection trusts when `DATABASE_CA_FILE` names none: Amazon RDS's
/// root CAs (RDS and Aurora endpoints) and Amazon Trust Services' (RDS Proxy's endpoints,
/// whose certificates come from ACM), written by `scripts/database-roots`. A Region RDS opened
/// after this file was written is not in it: there, `DATABASE_CA_FILE` names RDS's current
/// bundle (docs/deploy.md, *The database's secret and TLS*).
pub const AWS_DATABASE_ROOTS: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/certs/aws-database-roots.pem"
));

/// The database a JSON secret means when neither it nor `DATABASE_NAME` names one.
pub const DEFAULT_DATABASE: &str = "postgres";

/// The RDS-shaped secret: what Secrets Manager's RDS rotation keeps, or what a secret RDS
/// manages itself holds (`username` and `password`, the rest from [`Endpoint`]).
#[derive(Deserialize)]
struct RdsSecret {
    username: String,
    password: String,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    port: Option<Port>,
    #[serde(default)]
    dbname: Option<String>,
}

/// A port as a number (RDS writes one) or as a string (hand-made secrets do).
#[derive(Deserialize)]
#[serde(untagged)]
enum Port {
    Number(u16),
    Text(String),
}

/// The connection options a secret's text gives; the error says why not, never a value.
pub fn options_from_secret(
    id: &str,
    text: &str,
    endpoint: &Endpoint,
) -> Result<PgConnectOptions, String> {
    let text = text.trim();
    if !text.starts_with('{') {
        return PgConnectOptions::from_str(text).map_err(|_| {
            format!(
                "the secret '{id}' is neither a postgres:// URL nor JSON with username, password and host"
            )
        });
    }
    let secret: RdsSecret = serde_json::from_str(text).map_err(|e| {
        // A data error names a field (`missing field `host``); any other may quote the text.
        let what = match e.classify() {
            serde_json::error::Category::Data if e.to_string().starts_with("missing field") => e
                .to_string()
                .split(" at line")
                .next()
                .unwrap_or_default()
                .to_owned(),
            serde_json::error::Category::Data => "a field has the wrong type".to_owned(),
            _ => "malformed JSON".to_owned(),
        };
        format!(
            "the secret '{id}' is not {{\"username\", \"password\", \"host\", \"port\", \"dbname\"}}: {what}"
        )
    })?;
    let host = secret
        .host
        .filter(|h| !h.is_empty())
        .or_else(|| endpoint.host.clone())
        .ok_or_else(|| {
            format!("the secret '{id}' has no host, and {DATABASE_HOST_VAR} is not set")
        })?;
    let port = match secret.port {
        None => endpoint.port.unwrap_or(5432),
        Some(Port::Number(port)) => port,
        Some(Port::Text(port)) => port
            .trim()
            .parse()
            .map_err(|_| format!("the secret '{id}': port is not a port number"))?,
    };
    // Each field set on its own, never pasted into a URL: `#`, `%`, `?`, `@` or `/` in a
    // generated password mean themselves.
    let options = PgConnectOptions::new_without_pgpass()
        .host(&host)
        .port(port)
        .username(&secret.username)
        .password(&secret.password);
    // A secret without `dbname` names the database `postgres`, as Secrets Manager documents
    // its PostgreSQL secret ("If not specified, defaults to 'postgres'",
    // https://docs.aws.amazon.com/secretsmanager/latest/userguide/reference_secret_json_structure.html),
    // and as RDS creates it; left unset, the server would take the user's name.
    let dbname = secret
        .dbname
        .filter(|d| !d.is_empty())
        .or_else(|| endpoint.dbname.clone())
        .unwrap_or_else(|| DEFAULT_DATABASE.to_owned());
    Ok(options.database(&dbname))
}

/// Whether the database refused the login itself (SQLSTATE 28P01: a wrong password; 28000:
/// no `pg_hba.conf` line lets this role in), as it does after a rotation.
pub fn is_refused_login(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "28P01" || code == "28000")
}

/// The options of every pool: it gives up on a connection quickly instead of holding the
/// caller ([`crate::platform::db::lazy_pool`], [`Database::pool`]).
pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(3))
        // Lambda freezes idle instances; a connection found dead is replaced, not used.
        .test_before_acquire(true)
        .idle_timeout(Duration::from_secs(300))
}

/// How long opening a connection may take before the caller is answered without one.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Set once at cold start when the functions reach Postgres through a transaction-mode pooler
/// (`DATABASE_POOLER=transaction`): from then on no statement is named.
static UNNAMED: AtomicBool = AtomicBool::new(false);

/// From now on every statement [`crate::platform::db::exec`] runs is unnamed and inside a
/// transaction. A named statement is session state: a transaction-mode pooler hands the client's
/// next transaction to another server connection, where the name is unknown (PgBouncer before 1.21)
/// or, on RDS Proxy, pins the client to one server connection for the rest of its session
/// (docs/deploy.md, "RDS Proxy"). sqlx sends the unnamed statement in two round trips (Parse,
/// Describe and Sync; then Bind, Execute and Sync), and outside a transaction the first Sync
/// already ends it for the pooler, which may then run the Bind on another server connection: one
/// that has no unnamed statement, or another client's. So a statement that is not in a transaction
/// gets one of its own. The process is one function instance with one configuration, so the choice
/// is the process's; it is never turned off.
pub fn send_unnamed_statements() {
    UNNAMED.store(true, Ordering::Relaxed);
}

/// Whether this process sends every statement unnamed ([`send_unnamed_statements`]).
pub fn sends_unnamed_statements() -> bool {
    UNNAMED.load(Ordering::Relaxed)
}

/// The options every connection of this process takes, and what replaces them after a
/// rotation: the held connections read them at each connect, the pools are told.
pub struct Database {
    config: DatabaseConfig,
    client: Option<aws_sdk_secretsmanager::Client>,
    options: RwLock<PgConnectOptions>,
    /// Bumped each time the options are replaced.
    generation: AtomicU64,
    pools: Mutex<Vec<PgPool>>,
    /// When the secret was last read again after a refused login; one reader at a time.
    last_reread: tokio::sync::Mutex<Option<Instant>>,
}

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Database")
            .field("config", &self.config)
            .field("generation", &self.generation())
            .finish()
    }
}

impl Database {
    /// The options of `config`: its URL, or its secret read now (once per cold start). A
    /// secret that cannot be read or parsed, or a CA file that is not there, is a
    /// configuration error naming the variable and the secret, never a value.
    pub async fn open(config: &DatabaseConfig) -> Result<Arc<Self>, ConfigError> {
        let (options, client) = match &config.source {
            DatabaseSource::Url(url) => (
                PgConnectOptions::from_str(url)
                    .map_err(|_| ConfigError::new(DATABASE_URL_VAR, "is not a postgres:// URL"))?,
                None,
            ),
            DatabaseSource::Secret(id) => {
                let client = crate::platform::secrets::client().await;
                let text = tokio::time::timeout(
                    READ_BUDGET,
                    crate::platform::secrets::read_text(&client, id),
                )
                .await
                .unwrap_or_else(|_| Err(not_in_time(id)))
                .map_err(|detail| ConfigError::new(DATABASE_SECRET_VAR, detail))?;
                let options = options_from_secret(id, &text, &config.endpoint)
                    .map_err(|detail| ConfigError::new(DATABASE_SECRET_VAR, detail))?;
                (options, Some(client))
            }
        };
        let options = with_tls(options, config)?;
        if config.pooler == Pooler::Transaction {
            // The process is one function instance: its every statement from now on.
            send_unnamed_statements();
        }
        Ok(Arc::new(Self::with(config.clone(), client, options)))
    }

    /// Fixed options (tests, tools): never read again.
    pub fn fixed(options: PgConnectOptions) -> Arc<Self> {
        Arc::new(Self::with(DatabaseConfig::url(""), None, options))
    }

    fn with(
        config: DatabaseConfig,
        client: Option<aws_sdk_secretsmanager::Client>,
        options: PgConnectOptions,
    ) -> Self {
        Self {
            config,
            client,
            options: RwLock::new(options),
            generation: AtomicU64::new(0),
            pools: Mutex::new(Vec::new()),
            last_reread: tokio::sync::Mutex::new(None),
        }
    }

    /// The options a new connection takes now.
    pub fn options(&self) -> PgConnectOptions {
        self.options
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// How many times the options were replaced; a caller notes it before connecting.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A pool that connects on first use ([`crate::platform::db::lazy_pool`]) with these options, and
    /// takes the new ones after a rotation.
    pub fn pool(&self, max_connections: u32) -> PgPool {
        let pool = pool_options(max_connections).connect_lazy_with(self.options());
        self.pools
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(pool.clone());
        pool
    }

    /// After `error` on a connection attempt made with the options of `generation`: when the
    /// database refused the login and the options come from a secret, reads the secret again
    /// (the first time at once, then no more than once per [`REREAD_INTERVAL`]) and takes
    /// what it holds. True when the
    /// caller should try once more: the options are new since `generation`.
    pub async fn after_connect_error(&self, error: &sqlx::Error, generation: u64) -> bool {
        let (Some(client), DatabaseSource::Secret(id)) = (&self.client, &self.config.source) else {
            return false;
        };
        if !is_refused_login(error) {
            return false;
        }
        let mut last_reread = self.last_reread.lock().await;
        if self.generation() != generation {
            // Another caller read it while this one waited.
            return true;
        }
        if last_reread.is_some_and(|at| at.elapsed() < REREAD_INTERVAL) {
            tracing::warn!(var = DATABASE_SECRET_VAR, secret_id = %id,
                "the database refused the login; its secret was read less than {} s ago",
                REREAD_INTERVAL.as_secs());
            return false;
        }
        *last_reread = Some(Instant::now());
        let options =
            tokio::time::timeout(READ_BUDGET, crate::platform::secrets::read_text(client, id))
                .await
                .unwrap_or_else(|_| Err(not_in_time(id)))
                .and_then(|text| options_from_secret(id, &text, &self.config.endpoint))
                .and_then(|options| with_tls(options, &self.config).map_err(|e| e.to_string()));
        match options {
            Ok(options) => {
                self.replace(options);
                tracing::info!(var = DATABASE_SECRET_VAR, secret_id = %id,
                    "the database refused the login; its secret was read again and its options replaced");
                true
            }
            Err(detail) => {
                tracing::error!(var = DATABASE_SECRET_VAR, error = %detail,
                    "the database refused the login and its secret could not be read again");
                false
            }
        }
    }

    /// After a caller of one of the pools failed on the database (a pool cannot say why it
    /// could not connect): when the options come from a secret, one new connection is
    /// tried, and if its login is refused the secret is read again as after a held
    /// connection's ([`Self::after_connect_error`]); the pools' next connections take what
    /// it holds. The message that failed is delivered again, and finds them.
    pub async fn after_pool_error(&self) {
        if self.client.is_none() {
            return;
        }
        let generation = self.generation();
        let tried = tokio::time::timeout(CONNECT_TIMEOUT, self.options().connect()).await;
        if let Ok(Err(error)) = tried {
            self.after_connect_error(&error, generation).await;
        }
    }

    fn replace(&self, options: PgConnectOptions) {
        *self
            .options
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = options.clone();
        self.generation.fetch_add(1, Ordering::AcqRel);
        for pool in self
            .pools
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
        {
            pool.set_connect_options(options.clone());
        }
    }
}

fn not_in_time(id: &str) -> String {
    format!(
        "the secret '{id}' was not read within {} s",
        READ_BUDGET.as_secs()
    )
}

/// The options with what [`DatabaseConfig::tls_mode`] says: its `sslmode`, and for a mode that
/// verifies, the roots (`DATABASE_CA_FILE`, which must be there at cold start, else
/// [`AWS_DATABASE_ROOTS`]). Whatever a secret's URL says of `sslmode` or `sslrootcert` gives
/// way: the function's setting is the one place. `None`: the options as the URL made them.
pub fn with_tls(
    options: PgConnectOptions,
    config: &DatabaseConfig,
) -> Result<PgConnectOptions, ConfigError> {
    let Some(tls) = config.tls_mode() else {
        return Ok(options);
    };
    let options = options.ssl_mode(tls.ssl_mode());
    if !tls.verifies() {
        return Ok(options);
    }
    let Some(ca_file) = config.ca_file.as_deref() else {
        if let Some(region) = uncarried_rds_region(options.get_host()) {
            // Every connection would fail its handshake, first the deploy's migration twenty
            // minutes in: say it at the cold start, naming what to give instead.
            return Err(ConfigError::new(
                DATABASE_CA_VAR,
                format!(
                    "the database '{}' is an RDS endpoint of {region}, whose root CA the \
                     carried roots do not hold (they cover {}): give DatabaseCaFile with \
                     RDS's current global bundle (docs/deploy.md, The database's secret and TLS)",
                    options.get_host(),
                    carried_rds_regions().join(", "),
                ),
            ));
        }
        return Ok(options.ssl_root_cert_from_pem(AWS_DATABASE_ROOTS.to_vec()));
    };
    if !ca_file.is_file() {
        return Err(ConfigError::new(
            DATABASE_CA_VAR,
            format!(
                "'{}' is not a file (the CA bundle must be packaged with the function)",
                ca_file.display()
            ),
        ));
    }
    Ok(options.ssl_root_cert(ca_file))
}

/// The AWS Regions whose RDS root CA the carried roots hold, from their subject lines
/// (`CN = Amazon RDS <region> Root CA …`; the Beta and Preview roots are not Regions).
pub fn carried_rds_regions() -> Vec<String> {
    let text = std::str::from_utf8(AWS_DATABASE_ROOTS).unwrap_or_default();
    let mut regions: Vec<String> = text
        .lines()
        .filter(|line| line.starts_with("# "))
        .filter_map(|line| line.split("CN = Amazon RDS ").nth(1))
        .filter_map(|cn| cn.split(" Root CA").next())
        .filter(|region| !region.contains(' '))
        .map(str::to_owned)
        .collect();
    regions.sort();
    regions.dedup();
    regions
}

/// The Region of an RDS or Aurora endpoint whose root the carried roots lack: a host
/// `<name>.<id>.<region>.rds.amazonaws.com` (`.com.cn` in China). RDS Proxy's endpoints
/// (`….proxy-<id>.<region>.rds.amazonaws.com`) present ACM certificates, which chain to the
/// Amazon Trust Services roots carried beside them, in every Region.
fn uncarried_rds_region(host: &str) -> Option<String> {
    let host = host.to_ascii_lowercase();
    let rest = host
        .strip_suffix(".rds.amazonaws.com")
        .or_else(|| host.strip_suffix(".rds.amazonaws.com.cn"))?;
    let mut labels = rest.rsplit('.');
    let region = labels.next()?;
    if labels.next().is_some_and(|id| id.starts_with("proxy-")) {
        return None;
    }
    let carried = carried_rds_regions();
    (!carried.is_empty() && !carried.iter().any(|r| r == region)).then(|| region.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::config::{DATABASE_NAME_VAR, DATABASE_PORT_VAR, DATABASE_TLS_VAR};

    /// docs/deploy.md names the Regions whose RDS endpoints the carried roots verify; each
    /// has its root in the file, and no other is claimed.
    #[test]
    fn the_regions_the_docs_claim_have_their_root_carried() {
        let docs = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/deploy.md"));
        let line = docs
            .lines()
            .find(|l| l.starts_with("  Regions the carried roots cover: "))
            .expect("docs/deploy.md lists the Regions the carried roots cover");
        let claimed: Vec<String> = line
            .trim_start_matches("  Regions the carried roots cover: ")
            .trim_end_matches('.')
            .split(", ")
            .map(|r| r.trim_matches('`').to_owned())
            .collect();
        assert_eq!(claimed, carried_rds_regions());
        for region in [
            "us-east-1",
            "eu-west-1",
            "ap-southeast-4",
            "me-central-1",
            "ca-west-1",
            "il-central-1",
            "ap-southeast-5",
            "ap-southeast-7",
            "mx-central-1",
        ] {
            assert!(
                carried_rds_regions().iter().any(|r| r == region),
                "{region}"
            );
        }
    }

    /// An RDS endpoint of a Region the roots lack stops the cold start, naming
    /// DATABASE_CA_FILE and the Region; a proxy's endpoint there verifies against the Amazon
    /// Trust Services roots; a bundle of one's own takes any.
    #[test]
    fn an_rds_endpoint_of_a_region_without_its_root_is_refused_by_name() {
        let secret = (DATABASE_SECRET_VAR, "db");
        let at = |host: &str, vars: &[(&str, &str)]| {
            with_tls(PgConnectOptions::new().host(host), &config(vars).unwrap())
        };
        let newer = "billing.cluster-c0ffee.ap-east-2.rds.amazonaws.com";
        let refused = at(newer, &[secret]).unwrap_err();
        assert_eq!(refused.var, DATABASE_CA_VAR);
        assert!(refused.detail.contains("ap-east-2"), "{}", refused.detail);
        assert!(at(
            "billing.cluster-c0ffee.eu-west-1.rds.amazonaws.com",
            &[secret]
        )
        .is_ok());
        assert!(at(
            "billing.proxy-c0ffee.ap-east-2.rds.amazonaws.com",
            &[secret]
        )
        .is_ok());
        assert!(at("db.example.com", &[secret]).is_ok());
        assert!(at(newer, &[secret, (DATABASE_TLS_VAR, "require")]).is_ok());
        let bundle = std::env::temp_dir().join("billing-inbox-test-ca.pem");
        std::fs::write(&bundle, AWS_DATABASE_ROOTS).unwrap();
        let own = bundle.to_str().unwrap();
        assert!(at(newer, &[secret, (DATABASE_CA_VAR, own)]).is_ok());
    }
    use sqlx::postgres::PgSslMode;

    fn config(vars: &[(&str, &str)]) -> Result<DatabaseConfig, ConfigError> {
        DatabaseConfig::read(|var| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        })
    }

    /// The options a connection takes: the setting's `sslmode`, whatever the secret's URL
    /// said; a `DATABASE_URL` without the setting as it is.
    #[test]
    fn the_options_take_the_mode_the_setting_says() {
        let from = |vars: &[(&str, &str)], url: &str| {
            with_tls(
                PgConnectOptions::from_str(url).unwrap(),
                &config(vars).unwrap(),
            )
            .unwrap()
            .get_ssl_mode()
        };
        let secret = (DATABASE_SECRET_VAR, "db");
        let weak = "postgres://u:p@db.example/d?sslmode=disable";
        assert!(matches!(from(&[secret], weak), PgSslMode::VerifyFull));
        assert!(matches!(
            from(&[secret, (DATABASE_TLS_VAR, "verify-ca")], weak),
            PgSslMode::VerifyCa
        ));
        assert!(matches!(
            from(&[secret, (DATABASE_TLS_VAR, "require")], weak),
            PgSslMode::Require
        ));
        let local = "postgres://postgres@127.0.0.1:61320/postgres";
        let url = (DATABASE_URL_VAR, local);
        assert!(matches!(from(&[url], local), PgSslMode::Prefer));
        assert!(matches!(from(&[url], weak), PgSslMode::Disable));
        assert!(matches!(
            from(&[url, (DATABASE_TLS_VAR, "verify-full")], local),
            PgSslMode::VerifyFull
        ));
        // A bundle that is not there stops the cold start, naming it.
        let missing = with_tls(
            PgConnectOptions::from_str(local).unwrap(),
            &config(&[secret, (DATABASE_CA_VAR, "/nowhere/bundle.pem")]).unwrap(),
        )
        .unwrap_err();
        assert_eq!(missing.var, DATABASE_CA_VAR);
    }

    /// What the library trusts by default is Amazon's: RDS's roots, and the Amazon Trust
    /// Services roots RDS Proxy's certificates chain to; each block a root certificate (its
    /// issuer its subject), under the comment line that names it.
    #[test]
    fn the_carried_roots_are_rds_and_amazon_trust_services() {
        use base64::Engine;
        let text = std::str::from_utf8(AWS_DATABASE_ROOTS).unwrap();
        let subjects: Vec<&str> = text.lines().filter(|l| l.starts_with("# C = ")).collect();
        let blocks: Vec<&str> = text
            .split("-----BEGIN CERTIFICATE-----")
            .skip(1)
            .map(|b| b.split("-----END CERTIFICATE-----").next().unwrap())
            .collect();
        assert_eq!(blocks.len(), 107);
        assert_eq!(
            subjects.len(),
            blocks.len(),
            "one subject line per certificate"
        );
        let rds = subjects
            .iter()
            .filter(|s| s.contains("OU = Amazon RDS, "))
            .count();
        let amazon = subjects
            .iter()
            .filter(|s| {
                s.contains("CN = Amazon Root CA ")
                    || s.contains("CN = Starfield Services Root Certificate Authority - G2")
            })
            .count();
        assert_eq!((rds, amazon), (102, 5));
        for (subject, block) in subjects.iter().zip(blocks) {
            use der::Decode;
            let der = base64::engine::general_purpose::STANDARD
                .decode(block.split_whitespace().collect::<String>())
                .unwrap();
            let certificate = x509_cert::Certificate::from_der(&der).unwrap();
            let tbs = certificate.tbs_certificate;
            assert_eq!(tbs.issuer, tbs.subject, "a root: {subject}");
            let names = subject.split(" (until ").next().unwrap();
            let cn = names
                .split("CN = ")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap();
            assert!(
                tbs.subject.to_string().contains(cn.trim_matches('"')),
                "{subject} names {}",
                tbs.subject
            );
        }
    }

    #[test]
    fn an_rds_secret_is_read_field_by_field() {
        let none = Endpoint::default();
        let options = options_from_secret(
            "db",
            r#"{"username":"inbox","password":"a#b%c?d@e/f","engine":"postgres","host":"db.example","port":5433,"dbname":"billing","dbInstanceIdentifier":"billing-db"}"#,
            &none,
        )
        .unwrap();
        assert_eq!(options.get_host(), "db.example");
        assert_eq!(options.get_port(), 5433);
        assert_eq!(options.get_username(), "inbox");
        assert_eq!(options.get_database(), Some("billing"));
        let text_port = options_from_secret(
            "db",
            r#"{"username":"u","password":"p","host":"h","port":"6432"}"#,
            &none,
        )
        .unwrap();
        assert_eq!(text_port.get_port(), 6432);
    }

    #[test]
    fn a_secret_without_dbname_names_postgres_as_secrets_manager_documents() {
        // The shape Secrets Manager keeps for an Aurora PostgreSQL cluster's secret, with
        // the keys the console adds; no `dbname`, so the database is `postgres`.
        let options = options_from_secret(
            "db",
            r#"{"engine":"postgres","host":"billing.cluster-abc.eu-west-1.rds.amazonaws.com","username":"inbox","password":"p","port":5432,"dbClusterIdentifier":"billing","masterarn":"arn:aws:secretsmanager:eu-west-1:123456789012:secret:master-AbCdEf"}"#,
            &Endpoint::default(),
        )
        .unwrap();
        assert_eq!(options.get_database(), Some("postgres"));
        assert_eq!(options.get_port(), 5432);
        let managed = options_from_secret(
            "db",
            r#"{"username":"inbox_admin","password":"p"}"#,
            &Endpoint {
                host: Some("db.example".into()),
                ..Endpoint::default()
            },
        )
        .unwrap();
        assert_eq!(
            managed.get_database(),
            Some("postgres"),
            "not the user's name, which libpq would take"
        );
    }

    #[test]
    fn a_secret_rds_manages_takes_the_endpoint_from_the_environment() {
        let endpoint = config(&[
            (DATABASE_SECRET_VAR, "db"),
            (
                DATABASE_HOST_VAR,
                "billing.cluster-abc.eu-west-1.rds.amazonaws.com",
            ),
            (DATABASE_PORT_VAR, "5433"),
            (DATABASE_NAME_VAR, "billing"),
        ])
        .unwrap()
        .endpoint;
        let options = options_from_secret(
            "db",
            r#"{"username":"postgres","password":"p#%?"}"#,
            &endpoint,
        )
        .unwrap();
        assert_eq!(
            options.get_host(),
            "billing.cluster-abc.eu-west-1.rds.amazonaws.com"
        );
        assert_eq!(options.get_port(), 5433);
        assert_eq!(options.get_database(), Some("billing"));
        let error = options_from_secret(
            "db",
            r#"{"username":"postgres","password":"hunter2"}"#,
            &Endpoint::default(),
        )
        .unwrap_err();
        assert_eq!(
            error,
            "the secret 'db' has no host, and DATABASE_HOST is not set"
        );
        let bad_port =
            config(&[(DATABASE_SECRET_VAR, "db"), (DATABASE_PORT_VAR, "x")]).unwrap_err();
        assert_eq!(
            bad_port.to_string(),
            "DATABASE_PORT: 'x' is not a port number"
        );
    }

    #[test]
    fn a_bad_secret_is_named_and_never_quoted() {
        let error = options_from_secret(
            "db",
            r#"{"user":"u","password":"hunter2#"}"#,
            &Endpoint::default(),
        )
        .unwrap_err();
        assert_eq!(
            error,
            "the secret 'db' is not {\"username\", \"password\", \"host\", \"port\", \"dbname\"}: missing field `username`"
        );
        for text in [
            "hunter2#",
            r#"{"username":"u","password":"hunter2#","#,
            r#"{"username":"u","password":"hunter2#","host":"h","port":"hunter2"}"#,
            r#"{"username":"u","password":["hunter2"],"host":"h"}"#,
        ] {
            let error = options_from_secret("db", text, &Endpoint::default()).unwrap_err();
            assert!(!error.contains("hunter2"), "{error}");
            assert!(error.contains("'db'"), "{error}");
        }
    }
}
