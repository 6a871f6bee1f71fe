//! How the worker's reads of Stripe's API are made, for every object they read (a thin
//! event's, an entitlement summary's list): the API version they pin and the connected account
//! a read is made as.

/// The API version the fetched objects are read in: the one `decide` reads in both
/// generations' shapes, and the one the worker's other reads pin (`api.rs`).
pub const FETCH_VERSION: &str = "2025-03-31.basil";

/// The connected account a context names: a context of one `acct_…` segment. A deeper
/// context (an organization's account path) is sent as `Stripe-Context` only.
pub fn account(context: Option<&str>) -> Option<&str> {
    context.filter(|c| c.starts_with("acct_") && !c.contains('/'))
}
