from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="DebitAllocationFromGrantsItem")


@_attrs_define
class DebitAllocationFromGrantsItem:
    """
    Attributes:
        grant_id (str):
        amount (str): An amount as a decimal string, exact to 12 places (a grant's unit may be a decimal)
    """

    grant_id: str
    amount: str

    def to_dict(self) -> dict[str, Any]:
        grant_id = self.grant_id

        amount = self.amount

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "grant_id": grant_id,
                "amount": amount,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        grant_id = d.pop("grant_id")

        amount = d.pop("amount")

        debit_allocation_from_grants_item = cls(
            grant_id=grant_id,
            amount=amount,
        )

        return debit_allocation_from_grants_item
