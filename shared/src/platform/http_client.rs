//! The HTTP client for providers' hosts (a JWKS, an API), built on first use: a function that
//! may never call one (the intake, unless a Kinde key must be fetched) does not load TLS roots
//! before its first event.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// A `reqwest::Client` built on the first request and shared by its clones.
#[derive(Clone, Default)]
pub struct LazyClient {
    client: Arc<OnceLock<reqwest::Client>>,
    timeout: Option<Duration>,
}

impl LazyClient {
    /// A client whose requests time out after `timeout`, built when first used.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            client: Arc::default(),
            timeout: Some(timeout),
        }
    }

    /// The client; built now if this is its first use. Building fails only when the TLS
    /// backend cannot start; the next use tries again.
    pub fn get(&self) -> Result<&reqwest::Client, reqwest::Error> {
        if let Some(client) = self.client.get() {
            return Ok(client);
        }
        let mut builder = reqwest::Client::builder();
        if let Some(timeout) = self.timeout {
            builder = builder.timeout(timeout);
        }
        let built = builder.build()?;
        // Two first uses at once build two clients; one is kept, the other dropped.
        Ok(self.client.get_or_init(|| built))
    }
}

/// A client built already.
impl From<reqwest::Client> for LazyClient {
    fn from(client: reqwest::Client) -> Self {
        Self {
            client: Arc::new(OnceLock::from(client)),
            timeout: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_built_before_the_first_use_and_clones_share_it() {
        let lazy = LazyClient::with_timeout(Duration::from_secs(1));
        let clone = lazy.clone();
        assert!(lazy.client.get().is_none());

        let first: *const reqwest::Client = lazy.get().unwrap();

        assert!(std::ptr::eq(first, clone.get().unwrap()));
    }
}
