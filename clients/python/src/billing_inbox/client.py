"""The app API (docs/api.md): the generated operations behind a thin layer of auth, retries,
idempotency keys, paging and one error."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any, Callable, TypeVar

import httpx

from ._api import AuthenticatedClient
from ._api.api.default import (
    check_feature,
    get_account,
    list_account_events,
    list_usage,
    record_usage,
    reverse_usage,
)
from ._api.models import (
    Account,
    AccountEvents,
    AccountEventsEventsItem,
    Debit,
    DebitRequest,
    FeatureCheck,
    Reversal,
    UsagePage,
    UsagePageUsageItem,
)
from ._api.types import UNSET, Response
from .errors import BillingInboxError
from .retry import RetryPolicy, RetryTransport, retry_after_seconds

T = TypeVar("T")


def new_idempotency_key() -> str:
    """A new key: one per debit, never one per attempt."""
    return f"idem_{uuid.uuid4()}"


def _given(value: Any) -> Any:
    return UNSET if value is None else value


class BillingInbox:
    """``base_url`` is the API's base without /v1 (locally
    ``http://127.0.0.1:61900/lambda-url/api``); ``api_key`` a key of INBOX_API_KEYS, sent as
    ``Authorization: Bearer``; ``source`` the source calls name when they name none.
    ``api`` is the generated client, for any route the helpers do not cover (it retries and
    authenticates as they do)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        source: str | None = None,
        retry: RetryPolicy = RetryPolicy(),
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._settings = dict(
            base_url=base_url, api_key=api_key, source=source, retry=retry, timeout=timeout,
            transport=transport, sleep=sleep,
        )
        self.source = source
        self.api = AuthenticatedClient(
            base_url=base_url.rstrip("/"),
            token=api_key,
            timeout=httpx.Timeout(timeout),
            httpx_args={"transport": RetryTransport(retry, transport, sleep)},
        )

    def with_options(self, **changes: Any) -> BillingInbox:
        """The same client with some settings changed (``timeout``, ``retry``, …)."""
        return BillingInbox(**{**self._settings, **changes})

    def source_of(self, source: str | None = None) -> str:
        chosen = source or self.source
        if not chosen:
            raise TypeError("no source: name one in the client's settings or the call's")
        return chosen

    def _call(self, operation: Callable[..., Response[Any]], **kwargs: Any) -> Any:
        try:
            response = operation(client=self.api, **kwargs)
        except httpx.TimeoutException as e:
            raise BillingInboxError(0, "timeout", f"no answer in time: {e}") from e
        except httpx.TransportError as e:
            raise BillingInboxError(0, "unreachable", f"no answer: {e}") from e
        return _answer(response)

    def account(
        self, customer: str, *, source: str | None = None, period: str | None = None,
        stripe_account: str | None = None,
    ) -> Account:
        """The account's plan, features, allowance and subscriptions."""
        return self._call(
            get_account.sync_detailed, source=self.source_of(source), customer=customer,
            period=_given(period), stripe_account=_given(stripe_account),
        )

    def feature(
        self, customer: str, key: str, *, source: str | None = None,
        stripe_account: str | None = None,
    ) -> FeatureCheck:
        """May the customer use the feature (allowed False when it lacks it)."""
        return self._call(
            check_feature.sync_detailed, source=self.source_of(source), customer=customer,
            key=key, stripe_account=_given(stripe_account),
        )

    def debit(
        self, customer: str, amount: int, *, source: str | None = None,
        period: str | None = None, note: str | None = None, unit: str | None = None,
        idempotency_key: str | None = None, stripe_account: str | None = None,
    ) -> Debit:
        """Spends ``amount`` of the period's allowance, then of the credit grants of ``unit``
        (default ``credits``), once: the key (made here when not given) is kept across every
        retry."""
        body = DebitRequest(
            amount=amount, period=_given(period), note=_given(note), unit=_given(unit)
        )
        return self._call(
            record_usage.sync_detailed, source=self.source_of(source), customer=customer,
            body=body, idempotency_key=idempotency_key or new_idempotency_key(),
            stripe_account=_given(stripe_account),
        )

    def reverse(
        self, customer: str, usage_id: str, *, source: str | None = None,
        stripe_account: str | None = None,
    ) -> Reversal:
        """Takes an accepted debit back, once."""
        return self._call(
            reverse_usage.sync_detailed, source=self.source_of(source), customer=customer,
            usage_id=usage_id, stripe_account=_given(stripe_account),
        )

    def usage_pages(
        self, customer: str, *, source: str | None = None, period: str | None = None,
        limit: int | None = None, stripe_account: str | None = None,
    ) -> Iterator[UsagePage]:
        """The period's usage, a page at a time, following ``next`` to the end."""
        after: str | None = None
        while True:
            page: UsagePage = self._call(
                list_usage.sync_detailed, source=self.source_of(source), customer=customer,
                period=_given(period), limit=_given(limit), after=_given(after),
                stripe_account=_given(stripe_account),
            )
            yield page
            after = page.next_ if isinstance(page.next_, str) else None
            if after is None:
                return

    def usage(self, customer: str, **kwargs: Any) -> Iterator[UsagePageUsageItem]:
        """Every debit of the period, oldest first, across pages."""
        for page in self.usage_pages(customer, **kwargs):
            yield from page.usage

    def event_pages(
        self, customer: str, *, source: str | None = None, limit: int | None = None,
        stripe_account: str | None = None,
    ) -> Iterator[AccountEvents]:
        """The account's event log in provider order, a page at a time."""
        after: str | None = None
        while True:
            page: AccountEvents = self._call(
                list_account_events.sync_detailed, source=self.source_of(source),
                customer=customer, limit=_given(limit), after=_given(after),
                stripe_account=_given(stripe_account),
            )
            yield page
            after = page.next_ if isinstance(page.next_, str) else None
            if after is None:
                return

    def events(self, customer: str, **kwargs: Any) -> Iterator[AccountEventsEventsItem]:
        """Every event of the account's log, across pages."""
        for page in self.event_pages(customer, **kwargs):
            yield from page.events


def _answer(response: Response[Any]) -> Any:
    if response.status_code == 200 and response.parsed is not None:
        return response.parsed
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    fields = body if isinstance(body, dict) else {}
    code = fields.get("code") if isinstance(fields.get("code"), str) else f"http_{int(response.status_code)}"
    detail = fields.get("detail") if isinstance(fields.get("detail"), str) else ""
    retry_after = retry_after_seconds(response.headers.get("retry-after"))
    raise BillingInboxError(int(response.status_code), code, detail, body, retry_after)
