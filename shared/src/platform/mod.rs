//! The ground floor (docs/design.md §2.1): what every layer above uses to reach the world,
//! importing nothing of theirs (only `domain` and `signing`). [`config`] reads every
//! environment variable once at cold start into plain values; [`secrets`] fills in what
//! Secrets Manager holds; [`database`] turns the database's configuration into connection
//! options and reads its secret again after a rotation; [`presented_chain`] names what a
//! refused server's certificate chains to; [`db`] holds an instance's connection and sends
//! every statement; [`queue`] is SQS, [`aws_limits`] the limits AWS documents for its calls;
//! [`http_client`] reaches providers' hosts; [`budget`] is each source's share of its
//! provider's rate limit, shared by every instance; [`metrics`] names the EMF namespace;
//! [`schema`] applies the migrations; [`api_keys`] checks the app API's keys; [`clock`] is the
//! time a test can set; [`sim`] holds the points a simulation interrupts and its queue; [`telemetry`] is every
//! function's logs and traces.

pub mod api_keys;
pub mod aws_limits;
pub mod budget;
pub mod clock;
pub mod config;
pub mod database;
pub mod db;
pub mod differences;
pub mod http_client;
pub mod metrics;
pub mod presented_chain;
pub mod provider_key;
pub mod queue;
pub mod queued;
pub mod schema;
pub mod secrets;
pub mod sim;
pub mod telemetry;
