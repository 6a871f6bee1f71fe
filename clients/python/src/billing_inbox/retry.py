"""Retries of 503 and 429, honouring Retry-After: the same request, its Idempotency-Key
included, is sent again."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Callable

import httpx

RETRIED = (429, 503)


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` attempts after the first; the backoff starts at ``base_delay`` seconds and
    doubles when the answer names no Retry-After; no wait is longer than ``max_delay``."""

    retries: int = 3
    base_delay: float = 0.2
    max_delay: float = 20.0


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: delay-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        at = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, at - (time.time() if now is None else now))


def backoff(policy: RetryPolicy, attempt: int, retry_after: float | None) -> float:
    """How long to wait before attempt ``attempt`` (1 = the first retry)."""
    if retry_after is None:
        # a little jitter, so clients told the same thing do not come back together
        retry_after = policy.base_delay * 2 ** (attempt - 1) + random.random() * policy.base_delay
    return min(retry_after, policy.max_delay)


class RetryTransport(httpx.BaseTransport):
    """An httpx transport that sends a request again on 503 or 429, waiting as asked."""

    def __init__(
        self,
        policy: RetryPolicy,
        inner: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.policy = policy
        self.inner = inner or httpx.HTTPTransport()
        self.sleep = sleep

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        attempt = 0
        while True:
            response = self.inner.handle_request(request)
            if response.status_code not in RETRIED or attempt >= self.policy.retries:
                return response
            attempt += 1
            wait = backoff(
                self.policy, attempt, retry_after_seconds(response.headers.get("retry-after"))
            )
            response.read()
            response.close()
            self.sleep(wait)

    def close(self) -> None:
        self.inner.close()
