from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="CreditEvent")


@_attrs_define
class CreditEvent:
    """
    Attributes:
        event_id (int):
        type_ (None | str): The provider's event type
        occurred_at (datetime.datetime | None):
        grant_id (str):
        transaction_id (None | str): The ledger entry the event told; null for the grant's own event
    """

    event_id: int
    type_: None | str
    occurred_at: datetime.datetime | None
    grant_id: str
    transaction_id: None | str

    def to_dict(self) -> dict[str, Any]:
        event_id = self.event_id

        type_: None | str
        type_ = self.type_

        occurred_at: None | str
        if isinstance(self.occurred_at, datetime.datetime):
            occurred_at = self.occurred_at.isoformat()
        else:
            occurred_at = self.occurred_at

        grant_id = self.grant_id

        transaction_id: None | str
        transaction_id = self.transaction_id

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "event_id": event_id,
                "type": type_,
                "occurred_at": occurred_at,
                "grant_id": grant_id,
                "transaction_id": transaction_id,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        event_id = d.pop("event_id")

        def _parse_type_(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        type_ = _parse_type_(d.pop("type"))

        def _parse_occurred_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                occurred_at_type_0 = datetime.datetime.fromisoformat(data)

                return occurred_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        occurred_at = _parse_occurred_at(d.pop("occurred_at"))

        grant_id = d.pop("grant_id")

        def _parse_transaction_id(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        transaction_id = _parse_transaction_id(d.pop("transaction_id"))

        credit_event = cls(
            event_id=event_id,
            type_=type_,
            occurred_at=occurred_at,
            grant_id=grant_id,
            transaction_id=transaction_id,
        )

        return credit_event
