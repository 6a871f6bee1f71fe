//! The provider fakes (docs/design.md §6.6): each provider's API as its own documentation says
//! it behaves, every request checked against the provider's published description, in one
//! place for the integration tests, the simulator and `inboxctl`.

#[cfg(feature = "described")]
pub mod described;
#[cfg(feature = "described")]
pub mod hold;
#[cfg(feature = "described")]
pub mod kinde;
#[cfg(feature = "described")]
pub mod lemonsqueezy;
#[cfg(feature = "described")]
pub mod paddle;
#[cfg(feature = "described")]
pub mod polar;
pub mod stripe;
pub mod traffic;

pub use traffic::Metered;

#[cfg(feature = "described")]
pub use described::{Description, ProviderServer, KINDE, LEMONSQUEEZY, PADDLE, POLAR, STRIPE};
#[cfg(feature = "described")]
pub use kinde::FakeKinde;
#[cfg(feature = "described")]
pub use lemonsqueezy::FakeLemonSqueezy;
#[cfg(feature = "described")]
pub use paddle::FakePaddle;
#[cfg(feature = "described")]
pub use polar::FakePolar;
