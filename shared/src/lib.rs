//! billing-inbox's library: everything the functions (intake, bridge, worker, scheduler,
//! dispatcher, api, migrate) and `inboxctl` run. Layers, each importing only from itself and
//! the layers below it, no two files importing each other (docs/design.md §2.1):
//!
//! - [`handlers`]: one per function — adapt the Lambda event, orchestrate, answer; beside
//!   them [`dev`] (local tools, `dev` feature only) and [`console`] (the operator console's
//!   pages, rendered from the admin API's JSON: no I/O); among them `handlers::engine_room`
//!   (the reference scenarios run through the intake in process, for the api function and
//!   `inboxctl`);
//! - [`apply`] (one claimed event applied: decide, read, settle, rules, one write),
//!   [`audit`] (the fold put to work: `why` and the audit) and [`reconcile`] (the providers'
//!   APIs read back);
//! - [`inbox`] (the life of an `inbox_events` row), [`effects`] (the outbox: what changed,
//!   told to the app once) and [`providers`] (one folder per provider);
//! - [`billing`]: the model, the register rules, the registers as stored, the account view;
//! - [`platform`]: the ground floor — configuration, secrets, the database and its
//!   connections, the queue, the HTTP client, metrics, the schema, the app API's keys and the
//!   points a simulation interrupts;
//! - [`domain`] (the values everything above speaks in) and [`signing`] (what every signature
//!   check shares, and the Standard Webhooks format the inbox receives and sends).

pub mod apply;
pub mod audit;
pub mod billing;
pub mod console;
#[cfg(feature = "dev")]
pub mod dev;
pub mod domain;
pub mod effects;
pub mod handlers;
pub mod inbox;
pub mod meters;
pub mod operate;
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
