"""Checks that degrade safely: the feature check and the account read with a latency cap and
a last-known-good cache. On no answer in time, or a 5xx / 429, the answer comes from the
cache (``stale`` True, ``as_of`` when it was read) if it is no older than the staleness
allowed; without such an entry a feature is refused (fail closed) unless the caller chose
open, and an account read raises. A 4xx is an answer, never hidden by the cache."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Protocol

from ._api.models import Account, FeatureCheck
from .client import BillingInbox
from .errors import BillingInboxError
from .retry import RetryPolicy


class CheckCache(Protocol):
    def get(self, key: str) -> tuple[dict[str, Any], str] | None: ...

    def set(self, key: str, value: dict[str, Any], at: str) -> None: ...


class MemoryCheckCache:
    def __init__(self) -> None:
        self.entries: dict[str, tuple[dict[str, Any], str]] = {}

    def get(self, key: str) -> tuple[dict[str, Any], str] | None:
        return self.entries.get(key)

    def set(self, key: str, value: dict[str, Any], at: str) -> None:
        self.entries[key] = (value, at)


class FileCheckCache:
    """A cache kept in one JSON file, so a process started while the API is down still has
    its last answers."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _all(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> tuple[dict[str, Any], str] | None:
        entry = self._all().get(key)
        return None if entry is None else (entry["value"], entry["at"])

    def set(self, key: str, value: dict[str, Any], at: str) -> None:
        entries = self._all()
        entries[key] = {"value": value, "at": at}
        with open(self.path + ".new", "w", encoding="utf-8") as f:
            json.dump(entries, f)
        os.replace(self.path + ".new", self.path)


@dataclass(frozen=True)
class GuardedFeature:
    """``check`` is the API's answer (now, or cached); None when neither had one, and then
    ``allowed`` is the caller's choice (closed: False)."""

    key: str
    allowed: bool
    stale: bool
    as_of: str | None
    check: FeatureCheck | None

    @property
    def value(self) -> Any:
        return None if self.check is None else self.check.value


@dataclass(frozen=True)
class GuardedAccount:
    account: Account
    stale: bool
    as_of: str


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class GuardedChecks:
    """``timeout`` caps one check (seconds, no retries: the cache answers instead);
    ``max_staleness`` is how old (seconds) a cached answer may be and still be given."""

    def __init__(
        self,
        client: BillingInbox,
        *,
        timeout: float = 0.5,
        max_staleness: float = 15 * 60,
        fail_open: bool = False,
        cache: CheckCache | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.client = client.with_options(timeout=timeout, retry=RetryPolicy(retries=0))
        self.max_staleness = max_staleness
        self.fail_open = fail_open
        self.cache = cache if cache is not None else MemoryCheckCache()
        self.now = now

    def feature(self, customer: str, key: str, *, source: str | None = None) -> GuardedFeature:
        cache_key = f"{self.client.source_of(source)}/{customer}/feature/{key}"
        got = self._guarded(cache_key, lambda: self.client.feature(customer, key, source=source))
        if got is None:
            # Nothing seen: never grant what was not seen granted, unless the caller chose open.
            return GuardedFeature(key, self.fail_open, True, None, None)
        value, stale, at = got
        check = FeatureCheck.from_dict(value)
        return GuardedFeature(key, check.allowed, stale, at, check)

    def account(self, customer: str, *, source: str | None = None, period: str | None = None) -> GuardedAccount:
        cache_key = f"{self.client.source_of(source)}/{customer}/account/{period or ''}"
        got = self._guarded(
            cache_key, lambda: self.client.account(customer, source=source, period=period), rethrow=True
        )
        assert got is not None
        value, stale, at = got
        return GuardedAccount(Account.from_dict(value), stale, at)

    def _guarded(self, cache_key: str, call: Callable[[], Any], rethrow: bool = False):
        try:
            answer = call().to_dict()
        except BillingInboxError as error:
            if not error.unavailable:
                raise
            entry = self.cache.get(cache_key)
            if entry is not None:
                value, at = entry
                age = self.now() - datetime.fromisoformat(at).timestamp()
                if age <= self.max_staleness:
                    return value, True, at
            if rethrow:
                raise
            return None
        at = _iso(self.now())
        self.cache.set(cache_key, answer, at)
        return answer, False, at
