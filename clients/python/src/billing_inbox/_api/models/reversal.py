from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="Reversal")


@_attrs_define
class Reversal:
    """
    Attributes:
        usage_id (str):
        amount (int):
        period (str):
        used (int):
        remaining (int):
        reversed_at (datetime.datetime):
        replayed (bool):
    """

    usage_id: str
    amount: int
    period: str
    used: int
    remaining: int
    reversed_at: datetime.datetime
    replayed: bool

    def to_dict(self) -> dict[str, Any]:
        usage_id = self.usage_id

        amount = self.amount

        period = self.period

        used = self.used

        remaining = self.remaining

        reversed_at = self.reversed_at.isoformat()

        replayed = self.replayed

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "usage_id": usage_id,
                "amount": amount,
                "period": period,
                "used": used,
                "remaining": remaining,
                "reversed_at": reversed_at,
                "replayed": replayed,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        usage_id = d.pop("usage_id")

        amount = d.pop("amount")

        period = d.pop("period")

        used = d.pop("used")

        remaining = d.pop("remaining")

        reversed_at = datetime.datetime.fromisoformat(d.pop("reversed_at"))

        replayed = d.pop("replayed")

        reversal = cls(
            usage_id=usage_id,
            amount=amount,
            period=period,
            used=used,
            remaining=remaining,
            reversed_at=reversed_at,
            replayed=replayed,
        )

        return reversal
