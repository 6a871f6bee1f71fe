//! billing-inbox's library: everything the intake, worker and scheduler functions and
//! `inboxctl` run. Layers, with dependencies pointing one way (docs/design.md §2):
//!
//! - [`handlers`]: one per function — adapt the Lambda event, orchestrate, answer;
//! - [`apply`] (one claimed event applied: decide, read, settle, rules, one write),
//!   [`inbox`] (the life of an `inbox_events` row), [`effects`] (the outbox: what changed,
//!   told to the app once), [`billing`] (the model, the registers, the account view),
//!   [`providers`] (one folder per provider), [`reconcile`], [`schema`] (the migrations applied, and why not);
//! - [`domain`]: the values everything above speaks in;
//! - beside them: [`config`] (environment variables), [`api_keys`] (the app API's keys), [`secrets`] (Secrets Manager), [`database`] (the
//!   database's secret and TLS), [`db`] (the pool), [`queue`] (SQS), [`http_client`] (providers' hosts), [`signing`] (what
//!   every signature check shares, and the Standard Webhooks format the inbox receives and
//!   sends), [`metrics`] (the metrics' namespace), [`sim`] (the points a simulation
//!   interrupts; the simulated queue) and [`dev`] (local tools, `dev` feature only).

pub mod apply;
pub mod audit;
pub mod billing;
#[cfg(feature = "dev")]
pub mod dev;
pub mod domain;
pub mod effects;
pub mod handlers;
pub mod inbox;
pub mod platform;
pub mod providers;
pub mod reconcile;
pub mod signing;

use std::future::Future;
use std::pin::Pin;

/// A boxed future, so that contracts with async methods (the providers', the pool's and the
/// queue's hooks) can be used as trait objects.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The schema, applied by the migrate function on every deploy ([`platform::schema::apply`]), by
/// `inboxctl migrate` and by the tests.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");
