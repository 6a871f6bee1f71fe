//! A source's provider API key as its calls use it: known at cold start, or read on use.

use std::fmt;
use std::sync::Arc;

/// A source's API key whose read failed at cold start, read again when a provider read needs
/// it ([`crate::platform::secrets::ApiKeyRead`], with a backoff). The configuration only
/// carries it beside its source; the secrets module makes it.
pub trait ApiKeyOnUse: fmt::Debug + Send + Sync {
    /// The key: the one read, or a read now when the backoff allows it, or why not.
    fn key(&self) -> crate::BoxFuture<'_, anyhow::Result<String>>;
    /// Failed reads of its secret so far.
    fn failures(&self) -> u32;
}

/// A provider API key as a source's reads use it.
#[derive(Clone)]
pub enum ApiKey {
    /// Inline, or read from the source's secret at cold start.
    Known(String),
    /// Read from the source's secret on use: the read at cold start failed.
    OnUse(Arc<dyn ApiKeyOnUse>),
}

impl ApiKey {
    pub async fn get(&self) -> anyhow::Result<String> {
        match self {
            Self::Known(key) => Ok(key.clone()),
            Self::OnUse(read) => read.key().await,
        }
    }
}

impl From<&str> for ApiKey {
    fn from(key: &str) -> Self {
        Self::Known(key.to_owned())
    }
}

impl From<String> for ApiKey {
    fn from(key: String) -> Self {
        Self::Known(key)
    }
}
