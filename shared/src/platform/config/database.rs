//! Where the functions' database is, and how its server is checked.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use super::ConfigError;

// Where the functions' database is: `DATABASE_URL` (local use and tests), or the secret
// `DATABASE_SECRET_ID` names, which `platform::database` reads into connection options at
// cold start, and how its server is checked (docs/design.md §5.3).
pub const DATABASE_URL_VAR: &str = "DATABASE_URL";
pub const DATABASE_SECRET_VAR: &str = "DATABASE_SECRET_ID";
pub const DATABASE_CA_VAR: &str = "DATABASE_CA_FILE";
pub const DATABASE_TLS_VAR: &str = "DATABASE_TLS";
pub const DATABASE_HOST_VAR: &str = "DATABASE_HOST";
pub const DATABASE_PORT_VAR: &str = "DATABASE_PORT";
pub const DATABASE_NAME_VAR: &str = "DATABASE_NAME";
pub const DATABASE_POOLER_VAR: &str = "DATABASE_POOLER";

/// `DATABASE_TLS`: what a connection asks of the server, by libpq's `sslmode` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// TLS, with a certificate that chains to the roots and names the host: the default of a
    /// secret's connections.
    VerifyFull,
    /// TLS, with a certificate that chains to the roots, whatever name it holds (a tunnel
    /// reached as `localhost`).
    VerifyCa,
    /// TLS, the certificate unchecked: encrypted, the server not authenticated.
    Require,
    /// TLS when the server offers it, unchecked; else none (a URL without `sslmode`).
    Prefer,
    /// No TLS.
    Disable,
}

impl Tls {
    fn parse(value: &str) -> Result<Self, ConfigError> {
        match value {
            "verify-full" => Ok(Self::VerifyFull),
            "verify-ca" => Ok(Self::VerifyCa),
            "require" => Ok(Self::Require),
            "prefer" => Ok(Self::Prefer),
            "disable" => Ok(Self::Disable),
            other => Err(ConfigError::new(
                DATABASE_TLS_VAR,
                format!("'{other}' is not one of verify-full, verify-ca, require, prefer, disable"),
            )),
        }
    }

    /// Whether the server's certificate is checked against roots.
    pub fn verifies(self) -> bool {
        matches!(self, Self::VerifyFull | Self::VerifyCa)
    }

    pub fn ssl_mode(self) -> sqlx::postgres::PgSslMode {
        use sqlx::postgres::PgSslMode;
        match self {
            Self::VerifyFull => PgSslMode::VerifyFull,
            Self::VerifyCa => PgSslMode::VerifyCa,
            Self::Require => PgSslMode::Require,
            Self::Prefer => PgSslMode::Prefer,
            Self::Disable => PgSslMode::Disable,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::VerifyFull => "verify-full",
            Self::VerifyCa => "verify-ca",
            Self::Require => "require",
            Self::Prefer => "prefer",
            Self::Disable => "disable",
        }
    }
}

/// Where the connection settings come from.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseSource {
    /// `DATABASE_URL`, fixed for the process.
    Url(String),
    /// `DATABASE_SECRET_ID`: the secret's ARN or name.
    Secret(String),
}

/// `DATABASE_URL` holds a password: never shown.
impl fmt::Debug for DatabaseSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(_) => f.write_str("Url(redacted)"),
            Self::Secret(id) => f.debug_tuple("Secret").field(id).finish(),
        }
    }
}

/// What a function reads about its database at cold start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseConfig {
    pub source: DatabaseSource,
    /// `DATABASE_TLS` as given; [`Self::tls_mode`] says what the connections do.
    pub tls: Option<Tls>,
    /// `DATABASE_CA_FILE`: a PEM bundle that a verifying connection checks the server
    /// against instead of [`crate::platform::database::AWS_DATABASE_ROOTS`]; with it the default is `verify-full`, for a
    /// URL too. A relative path is taken from the function's package (`LAMBDA_TASK_ROOT`).
    pub ca_file: Option<PathBuf>,
    /// Where the database is when its secret does not say: the secret RDS manages for a
    /// master user holds only `username` and `password`.
    pub endpoint: Endpoint,
    /// `DATABASE_POOLER`: what is between the functions and Postgres.
    pub pooler: Pooler,
}

/// `DATABASE_POOLER`: `none` (the default) when the functions reach Postgres itself, or
/// `transaction` through a pooler that may hand each transaction to another server
/// connection: RDS Proxy, PgBouncer's `pool_mode = transaction` (docs/deploy.md, RDS Proxy).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooler {
    /// Each statement is prepared once per connection under a name and cached: one round
    /// trip each after the first.
    #[default]
    None,
    /// No session state: every statement is unnamed (one round trip more each), and the
    /// worker bounds its transactions through a function, not a `SET` (RDS Proxy pins a
    /// session that runs `SET` or names a prepared statement).
    Transaction,
}

impl Pooler {
    fn parse(value: &str) -> Result<Self, ConfigError> {
        match value {
            "none" => Ok(Self::None),
            "transaction" => Ok(Self::Transaction),
            other => Err(ConfigError::new(
                DATABASE_POOLER_VAR,
                format!(
                    "'{other}' is neither 'none' nor 'transaction' (RDS Proxy is 'transaction')"
                ),
            )),
        }
    }
}

/// `DATABASE_HOST`, `DATABASE_PORT`, `DATABASE_NAME`: what a JSON secret's `host`, `port`
/// and `dbname` fall back to (the secret's own win).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub dbname: Option<String>,
}

impl DatabaseConfig {
    /// Reads `DATABASE_SECRET_ID` or `DATABASE_URL` (exactly one), `DATABASE_TLS` and
    /// `DATABASE_CA_FILE`.
    pub fn read(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |var: &str| {
            lookup(var)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let source = match (get(DATABASE_SECRET_VAR), get(DATABASE_URL_VAR)) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    DATABASE_SECRET_VAR,
                    "is set beside DATABASE_URL: set one (the secret when deployed, the URL for local use)",
                ))
            }
            (Some(id), None) => DatabaseSource::Secret(id),
            (None, Some(url)) => {
                PgConnectOptions::from_str(&url).map_err(|_| {
                    ConfigError::new(
                        DATABASE_URL_VAR,
                        "is not a postgres:// URL (a password's #, %, ? or / must be percent-encoded)",
                    )
                })?;
                DatabaseSource::Url(url)
            }
            (None, None) => {
                return Err(ConfigError::new(
                    DATABASE_SECRET_VAR,
                    "is not set (nor DATABASE_URL): name the database's secret",
                ))
            }
        };
        let ca_file = get(DATABASE_CA_VAR).map(|path| {
            let path = PathBuf::from(path);
            match (path.is_relative(), get("LAMBDA_TASK_ROOT")) {
                (true, Some(root)) => Path::new(&root).join(path),
                _ => path,
            }
        });
        let tls = get(DATABASE_TLS_VAR)
            .map(|value| Tls::parse(&value))
            .transpose()?;
        if let (Some(tls), Some(ca_file)) = (tls, &ca_file) {
            if !tls.verifies() {
                return Err(ConfigError::new(
                    DATABASE_CA_VAR,
                    format!(
                        "names a CA bundle ('{}'), but DATABASE_TLS '{}' checks no certificate: \
                         set DATABASE_TLS to verify-full (or verify-ca), or leave DATABASE_CA_FILE unset",
                        ca_file.display(),
                        tls.name()
                    ),
                ));
            }
        }
        let port = match get(DATABASE_PORT_VAR) {
            None => None,
            Some(port) => Some(port.parse().map_err(|_| {
                ConfigError::new(DATABASE_PORT_VAR, format!("'{port}' is not a port number"))
            })?),
        };
        let endpoint = Endpoint {
            host: get(DATABASE_HOST_VAR),
            port,
            dbname: get(DATABASE_NAME_VAR),
        };
        let pooler = get(DATABASE_POOLER_VAR)
            .map(|value| Pooler::parse(&value))
            .transpose()?
            .unwrap_or_default();
        Ok(Self {
            source,
            tls,
            ca_file,
            endpoint,
            pooler,
        })
    }

    /// A configuration of `url` alone, as tests and tools build one.
    pub fn url(url: impl Into<String>) -> Self {
        Self {
            source: DatabaseSource::Url(url.into()),
            tls: None,
            ca_file: None,
            endpoint: Endpoint::default(),
            pooler: Pooler::None,
        }
    }

    /// What every connection asks of the server: `DATABASE_TLS` when set; else `verify-full`
    /// for a secret's connections (a deployed function's) and with `DATABASE_CA_FILE`; else
    /// `None`, what the `DATABASE_URL` says (`prefer` when it names no `sslmode`: local use
    /// and tests, where Postgres is on 127.0.0.1).
    pub fn tls_mode(&self) -> Option<Tls> {
        match (self.tls, &self.source, &self.ca_file) {
            (Some(tls), _, _) => Some(tls),
            (None, DatabaseSource::Secret(_), _) | (None, _, Some(_)) => Some(Tls::VerifyFull),
            (None, DatabaseSource::Url(_), None) => None,
        }
    }
}
