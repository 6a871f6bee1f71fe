from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

T = TypeVar("T", bound="DebitRequest")


@_attrs_define
class DebitRequest:
    """A JSON object (an array is 400 body_not_object); a field is given or left out, never null (400 null_field).

    Attributes:
        amount (int):
        period (str | Unset): The month to spend. Left out: the UTC month the request arrives in, and a retry of the
            same body in a later month is the same request. A past month may be debited, a later one may not (400
            future_period).
        note (str | Unset): At most 500 characters, with no control characters but tab and newline
        unit (str | Unset): What the debit spends; left out, `credits` (the unit of the monthly allowance and of catalog
            packs). Else a currency in its minor units (`usd`, a Stripe monetary grant's), or a custom pricing unit's id.
            Anything else is 400 bad_unit. The same key with another unit is 422 idempotency_conflict.
    """

    amount: int
    period: str | Unset = UNSET
    note: str | Unset = UNSET
    unit: str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        amount = self.amount

        period = self.period

        note = self.note

        unit = self.unit

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "amount": amount,
            }
        )
        if period is not UNSET:
            field_dict["period"] = period
        if note is not UNSET:
            field_dict["note"] = note
        if unit is not UNSET:
            field_dict["unit"] = unit

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        amount = d.pop("amount")

        period = d.pop("period", UNSET)

        note = d.pop("note", UNSET)

        unit = d.pop("unit", UNSET)

        debit_request = cls(
            amount=amount,
            period=period,
            note=note,
            unit=unit,
        )

        return debit_request
