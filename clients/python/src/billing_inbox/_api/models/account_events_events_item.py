from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="AccountEventsEventsItem")


@_attrs_define
class AccountEventsEventsItem:
    """
    Attributes:
        event_id (int):
        provider_event_id (None | str): null once purged
        type_ (str):
        occurred_at (datetime.datetime):
        received_at (datetime.datetime | None):
        status (str): The inbox's status, or purged when only the account's log remembers the event Known values:
            received, processing, applied, ignored, failed, dead, unprocessable, purged (a client accepts others too).
        outcome (None | str): Known values: applied, ignored, unprocessable (a client accepts others too).
        reason (None | str):
        seen_count (int | None):
        via (None | str):
    """

    event_id: int
    provider_event_id: None | str
    type_: str
    occurred_at: datetime.datetime
    received_at: datetime.datetime | None
    status: str
    outcome: None | str
    reason: None | str
    seen_count: int | None
    via: None | str

    def to_dict(self) -> dict[str, Any]:
        event_id = self.event_id

        provider_event_id: None | str
        provider_event_id = self.provider_event_id

        type_ = self.type_

        occurred_at = self.occurred_at.isoformat()

        received_at: None | str
        if isinstance(self.received_at, datetime.datetime):
            received_at = self.received_at.isoformat()
        else:
            received_at = self.received_at

        status = self.status

        outcome: None | str
        outcome = self.outcome

        reason: None | str
        reason = self.reason

        seen_count: int | None
        seen_count = self.seen_count

        via: None | str
        via = self.via

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "event_id": event_id,
                "provider_event_id": provider_event_id,
                "type": type_,
                "occurred_at": occurred_at,
                "received_at": received_at,
                "status": status,
                "outcome": outcome,
                "reason": reason,
                "seen_count": seen_count,
                "via": via,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        event_id = d.pop("event_id")

        def _parse_provider_event_id(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        provider_event_id = _parse_provider_event_id(d.pop("provider_event_id"))

        type_ = d.pop("type")

        occurred_at = datetime.datetime.fromisoformat(d.pop("occurred_at"))

        def _parse_received_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                received_at_type_0 = datetime.datetime.fromisoformat(data)

                return received_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        received_at = _parse_received_at(d.pop("received_at"))

        status = d.pop("status")

        def _parse_outcome(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        outcome = _parse_outcome(d.pop("outcome"))

        def _parse_reason(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        reason = _parse_reason(d.pop("reason"))

        def _parse_seen_count(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        seen_count = _parse_seen_count(d.pop("seen_count"))

        def _parse_via(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        via = _parse_via(d.pop("via"))

        account_events_events_item = cls(
            event_id=event_id,
            provider_event_id=provider_event_id,
            type_=type_,
            occurred_at=occurred_at,
            received_at=received_at,
            status=status,
            outcome=outcome,
            reason=reason,
            seen_count=seen_count,
            via=via,
        )

        return account_events_events_item
