from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.credit_balance import CreditBalance
    from ..models.credit_grant import CreditGrant


T = TypeVar("T", bound="Credits")


@_attrs_define
class Credits:
    """
    Attributes:
        at (datetime.datetime): The time the balances are as of: the at asked for, else the store's clock
        balances (list[CreditBalance]): Per unit and scope, in (unit, scope) order
        grants (list[CreditGrant]): Every grant of the account, in the burn order a debit spends them in (priority,
            expiry, promotional before paid, effective_at, grant_id)
    """

    at: datetime.datetime
    balances: list[CreditBalance]
    grants: list[CreditGrant]

    def to_dict(self) -> dict[str, Any]:
        at = self.at.isoformat()

        balances = []
        for balances_item_data in self.balances:
            balances_item = balances_item_data.to_dict()
            balances.append(balances_item)

        grants = []
        for grants_item_data in self.grants:
            grants_item = grants_item_data.to_dict()
            grants.append(grants_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "at": at,
                "balances": balances,
                "grants": grants,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.credit_balance import CreditBalance
        from ..models.credit_grant import CreditGrant

        d = dict(src_dict)
        at = datetime.datetime.fromisoformat(d.pop("at"))

        balances = []
        _balances = d.pop("balances")
        for balances_item_data in _balances:
            balances_item = CreditBalance.from_dict(balances_item_data)

            balances.append(balances_item)

        grants = []
        _grants = d.pop("grants")
        for grants_item_data in _grants:
            grants_item = CreditGrant.from_dict(grants_item_data)

            grants.append(grants_item)

        credits_ = cls(
            at=at,
            balances=balances,
            grants=grants,
        )

        return credits_
