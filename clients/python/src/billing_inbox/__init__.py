"""billing-inbox for Python: the app API, effects verified and applied, checks that degrade
safely. ``billing_inbox._api`` is the code generated from docs/openapi.yaml."""

from ._api import models
from .checks import FileCheckCache, GuardedAccount, GuardedChecks, GuardedFeature, MemoryCheckCache
from .client import BillingInbox, new_idempotency_key
from .errors import BillingInboxError
from .receiver import (
    Delivery,
    EffectReceiver,
    EffectStore,
    MemoryEffectStore,
    SqlEffectStore,
    state_key,
)
from .retry import RetryPolicy, backoff, retry_after_seconds
from .webhooks import STATE_TYPES, TYPED, Effect, Refusal, Verified, parse, secret_key, sign, verify

__all__ = [
    "BillingInbox", "BillingInboxError", "Delivery", "Effect", "EffectReceiver", "EffectStore",
    "FileCheckCache", "GuardedAccount", "GuardedChecks", "GuardedFeature", "MemoryCheckCache",
    "MemoryEffectStore", "Refusal", "RetryPolicy", "STATE_TYPES", "SqlEffectStore", "TYPED",
    "Verified", "backoff", "models", "new_idempotency_key", "parse", "retry_after_seconds",
    "secret_key", "sign", "state_key", "verify",
]
