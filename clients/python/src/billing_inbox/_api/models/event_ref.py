from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="EventRef")


@_attrs_define
class EventRef:
    """
    Attributes:
        event_id (int):
        type_ (str): The provider's event type
        occurred_at (datetime.datetime): The provider's time of the event
        via (str): Known values: webhook, eventbridge, reconciliation, correction, fetch (a client accepts others too).
        replayed (bool):
    """

    event_id: int
    type_: str
    occurred_at: datetime.datetime
    via: str
    replayed: bool

    def to_dict(self) -> dict[str, Any]:
        event_id = self.event_id

        type_ = self.type_

        occurred_at = self.occurred_at.isoformat()

        via = self.via

        replayed = self.replayed

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "event_id": event_id,
                "type": type_,
                "occurred_at": occurred_at,
                "via": via,
                "replayed": replayed,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        event_id = d.pop("event_id")

        type_ = d.pop("type")

        occurred_at = datetime.datetime.fromisoformat(d.pop("occurred_at"))

        via = d.pop("via")

        replayed = d.pop("replayed")

        event_ref = cls(
            event_id=event_id,
            type_=type_,
            occurred_at=occurred_at,
            via=via,
            replayed=replayed,
        )

        return event_ref
