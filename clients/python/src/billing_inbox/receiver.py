"""Applies effects as docs/effects.md tells an app to: a state (plan, features, a
subscription) only when its sequence is higher than the one applied for it, a fact (and a
type not known) once by id, never dropped for an older sequence."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from .webhooks import STATE_TYPES, Effect, Refusal, verify

APPLIED, DUPLICATE, OLDER = "applied", "duplicate", "older"


class EffectStore(Protocol):
    """Where the receiver remembers what it applied; keep it beside the app's own data."""

    def seen(self, effect_id: str) -> bool: ...

    def sequence(self, state_key: str) -> int | None: ...

    def record(self, effect_id: str, state: tuple[str, int] | None) -> None: ...


class MemoryEffectStore:
    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.states: dict[str, int] = {}

    def seen(self, effect_id: str) -> bool:
        return effect_id in self.ids

    def sequence(self, state_key: str) -> int | None:
        return self.states.get(state_key)

    def record(self, effect_id: str, state: tuple[str, int] | None) -> None:
        self.ids.add(effect_id)
        if state and self.states.get(state[0], 0) < state[1]:
            self.states[state[0]] = state[1]


class SqlEffectStore:
    """The store as two tables of the app's database, through a DB-API connection
    (``sqlite3``; with psycopg pass ``placeholder="%s"``). Give the handler the same connection
    and its writes commit with the record of the effect: applied and remembered together."""

    TABLES = (
        "CREATE TABLE IF NOT EXISTS billing_effects_seen (id TEXT PRIMARY KEY)",
        "CREATE TABLE IF NOT EXISTS billing_effect_states"
        " (state_key TEXT PRIMARY KEY, sequence BIGINT NOT NULL)",
    )

    def __init__(self, connection: Any, placeholder: str = "?") -> None:
        self.connection = connection
        self.p = placeholder

    def create_tables(self) -> None:
        cursor = self.connection.cursor()
        for statement in self.TABLES:
            cursor.execute(statement)
        self.connection.commit()

    def seen(self, effect_id: str) -> bool:
        cursor = self.connection.cursor()
        cursor.execute(f"SELECT 1 FROM billing_effects_seen WHERE id = {self.p}", (effect_id,))
        return cursor.fetchone() is not None

    def sequence(self, state_key: str) -> int | None:
        cursor = self.connection.cursor()
        cursor.execute(
            f"SELECT sequence FROM billing_effect_states WHERE state_key = {self.p}", (state_key,)
        )
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def record(self, effect_id: str, state: tuple[str, int] | None) -> None:
        p = self.p
        cursor = self.connection.cursor()
        cursor.execute(
            f"INSERT INTO billing_effects_seen (id) VALUES ({p}) ON CONFLICT (id) DO NOTHING",
            (effect_id,),
        )
        if state is not None:
            cursor.execute(
                f"INSERT INTO billing_effect_states (state_key, sequence) VALUES ({p}, {p})"
                " ON CONFLICT (state_key) DO UPDATE SET sequence = excluded.sequence"
                " WHERE billing_effect_states.sequence < excluded.sequence",
                state,
            )
        self.connection.commit()


def state_key(effect: Effect) -> str | None:
    """The one state a kind carries: per account (plan, features), per subscription. None for
    a fact."""
    if effect.type not in STATE_TYPES:
        return None
    if effect.type == "billing.subscription_updated":
        subscription = effect.data.get("subscription") or {}
        return f"{effect.source}/{effect.customer_id}/subscription/{subscription.get('id', '')}"
    return f"{effect.source}/{effect.customer_id}/{effect.type}"


@dataclass(frozen=True)
class Delivery:
    """What to answer one delivery: 200 for applied, duplicate or older (all acknowledged),
    401 or 400 for a refusal."""

    status: int
    outcome: str | None = None
    effect: Effect | None = None
    refusal: Refusal | None = None


class EffectReceiver:
    def __init__(self, store: EffectStore, handler: Callable[[Effect], None]) -> None:
        self.store = store
        self.handler = handler
        self._lock = threading.Lock()

    def receive(self, effect: Effect) -> str:
        """Applies one verified effect, one at a time (two copies together apply once):
        ``applied``, ``duplicate`` (this id came before) or ``older`` (a newer state is
        applied). When the handler raises, nothing is remembered, so the retry applies it."""
        with self._lock:
            if self.store.seen(effect.id):
                return DUPLICATE
            key = state_key(effect)
            if key is not None:
                applied = self.store.sequence(key)
                if applied is not None and applied >= effect.sequence:
                    self.store.record(effect.id, None)
                    return OLDER
            self.handler(effect)
            self.store.record(effect.id, None if key is None else (key, effect.sequence))
            return APPLIED

    def deliver(
        self,
        body: bytes | str,
        headers: Mapping[str, str],
        secret: str | Sequence[str],
        **options: Any,
    ) -> Delivery:
        """One delivery as an endpoint gets it: verified, then applied."""
        verified = verify(body, headers, secret, **options)
        if isinstance(verified, Refusal):
            return Delivery(400 if verified.reason == "bad_body" else 401, refusal=verified)
        return Delivery(200, self.receive(verified.effect), verified.effect)
