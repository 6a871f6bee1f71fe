//! The provider fakes (docs/design.md §6.6): each provider's API as its own documentation says
//! it behaves, every request checked against the provider's published description, in one
//! place for the integration tests, the simulator and `inboxctl`.

pub mod described;
pub mod kinde;
pub mod lemonsqueezy;
pub mod paddle;
pub mod polar;
pub mod stripe;
pub mod stripe_reads;
pub mod traffic;

pub use described::{Description, ProviderServer, KINDE, LEMONSQUEEZY, PADDLE, POLAR, STRIPE};
pub use kinde::FakeKinde;
pub use lemonsqueezy::FakeLemonSqueezy;
pub use paddle::FakePaddle;
pub use polar::FakePolar;
