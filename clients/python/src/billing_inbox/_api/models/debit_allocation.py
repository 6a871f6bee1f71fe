from __future__ import annotations

from collections.abc import Mapping
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    Self,
    TypeVar,
    cast,
)

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.debit_allocation_from_grants_item import DebitAllocationFromGrantsItem


T = TypeVar("T", bound="DebitAllocation")


@_attrs_define
class DebitAllocation:
    """What the debit took, as it was decided: the allowance first, then grants in the burn order order_version. The
    account's credits read derives each debit's allocation again from everything known, so a grant told later that comes
    first in the burn order takes its place there; this answer stays as given.

        Attributes:
            from_allowance (int):
            from_grants (list[DebitAllocationFromGrantsItem]):
            order_version (Literal[1]):
    """

    from_allowance: int
    from_grants: list[DebitAllocationFromGrantsItem]
    order_version: Literal[1]

    def to_dict(self) -> dict[str, Any]:
        from_allowance = self.from_allowance

        from_grants = []
        for from_grants_item_data in self.from_grants:
            from_grants_item = from_grants_item_data.to_dict()
            from_grants.append(from_grants_item)

        order_version = self.order_version

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "from_allowance": from_allowance,
                "from_grants": from_grants,
                "order_version": order_version,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.debit_allocation_from_grants_item import (
            DebitAllocationFromGrantsItem,
        )

        d = dict(src_dict)
        from_allowance = d.pop("from_allowance")

        from_grants = []
        _from_grants = d.pop("from_grants")
        for from_grants_item_data in _from_grants:
            from_grants_item = DebitAllocationFromGrantsItem.from_dict(
                from_grants_item_data
            )

            from_grants.append(from_grants_item)

        order_version = cast(Literal[1], d.pop("order_version"))
        if order_version != 1:
            raise ValueError(f"order_version must match const 1, got '{order_version}'")

        debit_allocation = cls(
            from_allowance=from_allowance,
            from_grants=from_grants,
            order_version=order_version,
        )

        return debit_allocation
