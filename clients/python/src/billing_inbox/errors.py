"""The one error the client raises: the API's ``{code, detail}``, or the client's own for a
request that got no answer."""

from __future__ import annotations

from typing import Any


class BillingInboxError(Exception):
    """``status`` is the HTTP status, 0 when no answer came (``code`` is then ``timeout`` or
    ``unreachable``); ``code`` is stable, for programs (docs/api.md, Errors); ``detail`` is for
    people; ``body`` the whole answer (409 allowance_exhausted carries ``remaining``);
    ``retry_after`` the answer's Retry-After in seconds, when it had one."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body
        self.retry_after = retry_after

    @property
    def unavailable(self) -> bool:
        """No answer, or one that says the state could not be reached (or not now): a
        guarded check may answer from its cache."""
        return self.status == 0 or self.status == 429 or self.status >= 500
