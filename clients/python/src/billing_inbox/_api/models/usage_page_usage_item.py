from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="UsagePageUsageItem")


@_attrs_define
class UsagePageUsageItem:
    """
    Attributes:
        usage_id (str):
        amount (int):
        unit (str): What the debit spent: credits, or the unit of the grants it spent
        idempotency_key (str):
        note (None | str):
        recorded_at (datetime.datetime):
    """

    usage_id: str
    amount: int
    unit: str
    idempotency_key: str
    note: None | str
    recorded_at: datetime.datetime

    def to_dict(self) -> dict[str, Any]:
        usage_id = self.usage_id

        amount = self.amount

        unit = self.unit

        idempotency_key = self.idempotency_key

        note: None | str
        note = self.note

        recorded_at = self.recorded_at.isoformat()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "usage_id": usage_id,
                "amount": amount,
                "unit": unit,
                "idempotency_key": idempotency_key,
                "note": note,
                "recorded_at": recorded_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        usage_id = d.pop("usage_id")

        amount = d.pop("amount")

        unit = d.pop("unit")

        idempotency_key = d.pop("idempotency_key")

        def _parse_note(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        note = _parse_note(d.pop("note"))

        recorded_at = datetime.datetime.fromisoformat(d.pop("recorded_at"))

        usage_page_usage_item = cls(
            usage_id=usage_id,
            amount=amount,
            unit=unit,
            idempotency_key=idempotency_key,
            note=note,
            recorded_at=recorded_at,
        )

        return usage_page_usage_item
