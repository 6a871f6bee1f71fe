//! The ground floor (docs/design.md §2.1): what every layer above uses to reach the world,
//! importing nothing of theirs (only `domain` and `signing`). [`config`] reads every
//! environment variable once at cold start into plain values; [`secrets`] fills in what
//! Secrets Manager holds; [`database`] turns the database's configuration into connection
//! options and reads its secret again after a rotation; [`db`] holds an instance's connection
//! and sends every statement; [`queue`] is SQS; [`http_client`] reaches providers' hosts;
//! [`metrics`] names the EMF namespace; [`schema`] applies the migrations; [`api_keys`] checks
//! the app API's keys; [`clock`] is the time a test can set; [`budget`] is each source's
//! share of its provider's rate limit, shared by every instance; [`sim`] holds the points a simulation interrupts and its queue.

pub mod api_keys;
pub mod budget;
pub mod clock;
pub mod config;
pub mod database;
pub mod db;
pub mod http_client;
pub mod metrics;
pub mod queue;
pub mod schema;
pub mod secrets;
pub mod sim;
