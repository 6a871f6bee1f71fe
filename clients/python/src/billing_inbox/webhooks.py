"""Effects as the app receives them (docs/effects.md): Standard Webhooks signatures checked,
the body typed by the generated models."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._api import models

#: The generated model of each known type; a type not here is still an effect (a fact).
TYPED: dict[str, Any] = {
    "billing.plan_changed": models.PlanChangedEffect,
    "billing.features_changed": models.FeaturesChangedEffect,
    "billing.subscription_updated": models.SubscriptionUpdatedEffect,
    "billing.allowance_granted": models.AllowanceGrantedEffect,
    "billing.payment_succeeded": models.PaymentEffect,
    "billing.payment_failed": models.PaymentEffect,
    "billing.payment_refunded": models.PaymentEffect,
    "billing.customer_deleted": models.CustomerDeletedEffect,
    "billing.allowance_exhausted": models.AllowanceExhaustedEffect,
    "billing.usage_reversed": models.UsageReversedEffect,
    "billing.credits_granted": models.CreditsGrantedEffect,
    "billing.credits_expired": models.CreditsExpiredEffect,
    "billing.credits_voided": models.CreditsVoidedEffect,
    "billing.credits_low": models.CreditsCrossedEffect,
    "billing.credits_depleted": models.CreditsCrossedEffect,
}

#: The kinds that carry a state: the highest sequence wins. Every other kind, one not known
#: included, is a fact.
STATE_TYPES = frozenset(
    {"billing.plan_changed", "billing.features_changed", "billing.subscription_updated"}
)


@dataclass(frozen=True)
class Effect:
    """One effect: its envelope, ``data`` as sent, and ``typed``, the generated model of its
    type (``None`` for a type this version does not know, or a body its model cannot read:
    the effect is still given, never an exception)."""

    id: str
    type: str
    occurred_at: str
    data: dict[str, Any]
    body: dict[str, Any] = field(repr=False)
    typed: Any = field(default=None, repr=False)

    @property
    def source(self) -> str:
        return self.data["source"]

    @property
    def customer_id(self) -> str:
        return self.data["customer_id"]

    @property
    def sequence(self) -> int:
        return self.data["sequence"]

    @property
    def known(self) -> bool:
        return self.type in TYPED


@dataclass(frozen=True)
class Verified:
    effect: Effect
    id: str
    timestamp: int
    ok: bool = True


@dataclass(frozen=True)
class Refusal:
    """Why a delivery was refused: answer it 4xx (401 for a signature, 400 for a body) and
    apply nothing. ``reason``: missing_header, bad_timestamp, stale_timestamp, bad_signature,
    bad_secret, bad_body."""

    reason: str
    detail: str
    ok: bool = False


def secret_key(secret: str) -> bytes | None:
    """The key a ``whsec_…`` secret names (its base64 part, decoded); None if not base64."""
    encoded = secret.removeprefix("whsec_")
    if not re.fullmatch(r"[A-Za-z0-9+/]+={0,2}", encoded) or len(encoded) % 4:
        return None
    try:
        key = base64.b64decode(encoded, validate=True)
    except binascii.Error:
        return None
    return key or None


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The v1 signature: base64 HMAC-SHA256 over ``{id}.{timestamp}.{body}``."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def parse(body: Mapping[str, Any]) -> Effect:
    """An effect from its JSON body (already verified)."""
    typed = None
    model = TYPED.get(body["type"])
    if model is not None:
        try:
            typed = model.from_dict(body)
        except (KeyError, TypeError, ValueError):
            typed = None
    return Effect(
        id=body["id"], type=body["type"], occurred_at=body["occurred_at"],
        data=dict(body["data"]), body=dict(body), typed=typed,
    )


def verify(
    body: bytes | str,
    headers: Mapping[str, str],
    secret: str | Sequence[str],
    *,
    tolerance: int = 300,
    now: float | None = None,
) -> Verified | Refusal:
    """Verifies one delivery as Standard Webhooks says: the raw body (as received, before any
    JSON parsing), its headers and the secret (``whsec_…``), or several while one rotates. A
    signature header may carry several ``v1,…``; one that matches a secret is enough."""
    raw = body.encode() if isinstance(body, str) else bytes(body)
    msg_id = _header(headers, "webhook-id")
    stamp = _header(headers, "webhook-timestamp")
    signatures = _header(headers, "webhook-signature")
    if not msg_id or not stamp or not signatures:
        return Refusal("missing_header", "webhook-id, webhook-timestamp and webhook-signature are required")
    if not stamp.isdigit():
        return Refusal("bad_timestamp", "webhook-timestamp is not whole seconds")
    timestamp = int(stamp)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        return Refusal("stale_timestamp", f"webhook-timestamp is more than {tolerance} s from now")
    secrets = [secret] if isinstance(secret, str) else list(secret)
    keys = [secret_key(s) for s in secrets]
    if not keys or any(k is None for k in keys):
        return Refusal("bad_secret", "a secret is not whsec_ followed by base64")
    expected = [base64.b64decode(sign(k, msg_id, timestamp, raw)) for k in keys if k]
    matched = False
    for candidate in signatures.split(" "):
        version, _, value = candidate.partition(",")
        if version != "v1" or not value:
            continue
        try:
            given = base64.b64decode(value, validate=True)
        except binascii.Error:
            continue
        # compare_digest of unequal lengths is False: a bare "v1," never matches
        if any(hmac.compare_digest(e, given) for e in expected):
            matched = True
    if not matched:
        return Refusal("bad_signature", "no signature matches")
    try:
        parsed = json.loads(raw)
    except ValueError:
        return Refusal("bad_body", "the body is not JSON")
    if not _is_envelope(parsed):
        return Refusal("bad_body", "the body is not an effect (id, type, occurred_at, data)")
    if parsed["id"] != msg_id:
        return Refusal("bad_body", "the body's id is not webhook-id")
    return Verified(effect=parse(parsed), id=msg_id, timestamp=timestamp)


def _is_envelope(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    data = value.get("data")
    return (
        all(isinstance(value.get(k), str) for k in ("id", "type", "occurred_at"))
        and isinstance(data, dict)
        and isinstance(data.get("source"), str)
        and isinstance(data.get("customer_id"), str)
        and isinstance(data.get("sequence"), int)
        and not isinstance(data.get("sequence"), bool)
    )
