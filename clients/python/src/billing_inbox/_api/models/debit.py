from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="Debit")


@_attrs_define
class Debit:
    """
    Attributes:
        usage_id (str):
        amount (int):
        period (str):
        used (int):
        remaining (int):
        replayed (bool):
    """

    usage_id: str
    amount: int
    period: str
    used: int
    remaining: int
    replayed: bool

    def to_dict(self) -> dict[str, Any]:
        usage_id = self.usage_id

        amount = self.amount

        period = self.period

        used = self.used

        remaining = self.remaining

        replayed = self.replayed

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "usage_id": usage_id,
                "amount": amount,
                "period": period,
                "used": used,
                "remaining": remaining,
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

        replayed = d.pop("replayed")

        debit = cls(
            usage_id=usage_id,
            amount=amount,
            period=period,
            used=used,
            remaining=remaining,
            replayed=replayed,
        )

        return debit
