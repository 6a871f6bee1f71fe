from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="ReplayedEvent")


@_attrs_define
class ReplayedEvent:
    """
    Attributes:
        event_id (int):
        status (str): Known values: received, processing, applied, ignored, failed, dead, unprocessable (a client
            accepts others too).
    """

    event_id: int
    status: str

    def to_dict(self) -> dict[str, Any]:
        event_id = self.event_id

        status = self.status

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "event_id": event_id,
                "status": status,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        event_id = d.pop("event_id")

        status = d.pop("status")

        replayed_event = cls(
            event_id=event_id,
            status=status,
        )

        return replayed_event
