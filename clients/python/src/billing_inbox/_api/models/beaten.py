from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="Beaten")


@_attrs_define
class Beaten:
    """
    Attributes:
        event_id (int):
        reason (str):
        detail (str):
    """

    event_id: int
    reason: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        event_id = self.event_id

        reason = self.reason

        detail = self.detail

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "event_id": event_id,
                "reason": reason,
                "detail": detail,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        event_id = d.pop("event_id")

        reason = d.pop("reason")

        detail = d.pop("detail")

        beaten = cls(
            event_id=event_id,
            reason=reason,
            detail=detail,
        )

        return beaten
