//! The ground floor: configuration, secrets, the database, the queue and what every layer
//! above shares to reach them. Nothing here imports a layer above (docs/design.md §2.1).

pub mod api_keys;
pub mod config;
pub mod database;
pub mod db;
pub mod http_client;
pub mod metrics;
pub mod queue;
pub mod schema;
pub mod secrets;
pub mod sim;
