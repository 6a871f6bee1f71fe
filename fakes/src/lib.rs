//! The provider fakes (docs/design.md §6.6): each provider's API as its own documentation says
//! it behaves, every request checked against the provider's published description, in one
//! place for the integration tests, the simulator and `inboxctl`.

#[cfg(feature = "described")]
pub mod described;
pub mod polar_meter;
pub mod stripe;

#[cfg(feature = "described")]
pub use described::{Description, ProviderServer, KINDE, LEMONSQUEEZY, PADDLE, POLAR, STRIPE};
