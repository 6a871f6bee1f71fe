from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.debit_allocation import DebitAllocation


T = TypeVar("T", bound="Debit")


@_attrs_define
class Debit:
    """
    Attributes:
        usage_id (str):
        amount (int):
        unit (str):
        period (str):
        used (int): The period's accepted debits of the allowance's unit, what grants paid included
        remaining (int): What the period's allowance has left
        replayed (bool):
        allocation (DebitAllocation): What the debit took, as it was decided: the allowance first, then grants in the
            burn order order_version. The account's credits read derives each debit's allocation again from everything
            known, so a grant told later that comes first in the burn order takes its place there; this answer stays as
            given.
    """

    usage_id: str
    amount: int
    unit: str
    period: str
    used: int
    remaining: int
    replayed: bool
    allocation: DebitAllocation

    def to_dict(self) -> dict[str, Any]:
        usage_id = self.usage_id

        amount = self.amount

        unit = self.unit

        period = self.period

        used = self.used

        remaining = self.remaining

        replayed = self.replayed

        allocation = self.allocation.to_dict()

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "usage_id": usage_id,
                "amount": amount,
                "unit": unit,
                "period": period,
                "used": used,
                "remaining": remaining,
                "replayed": replayed,
                "allocation": allocation,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.debit_allocation import DebitAllocation

        d = dict(src_dict)
        usage_id = d.pop("usage_id")

        amount = d.pop("amount")

        unit = d.pop("unit")

        period = d.pop("period")

        used = d.pop("used")

        remaining = d.pop("remaining")

        replayed = d.pop("replayed")

        allocation = DebitAllocation.from_dict(d.pop("allocation"))

        debit = cls(
            usage_id=usage_id,
            amount=amount,
            unit=unit,
            period=period,
            used=used,
            remaining=remaining,
            replayed=replayed,
            allocation=allocation,
        )

        return debit
