from __future__ import annotations

import datetime
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
    from ..models.credit_debit_from_grants_item import CreditDebitFromGrantsItem


T = TypeVar("T", bound="CreditDebit")


@_attrs_define
class CreditDebit:
    """
    Attributes:
        usage_id (str):
        period (str): The month whose allowance it spent first
        at (datetime.datetime | None): When it was accepted: it spent the grants live then
        amount (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        from_allowance (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        from_grants (list[CreditDebitFromGrantsItem]): The grants of this balance it took from, in the burn order (a
            debit that spent grants of two scopes is listed under each balance, with its grants)
        unfunded (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        order_version (Literal[1]):
    """

    usage_id: str
    period: str
    at: datetime.datetime | None
    amount: str
    from_allowance: str
    from_grants: list[CreditDebitFromGrantsItem]
    unfunded: str
    order_version: Literal[1]

    def to_dict(self) -> dict[str, Any]:
        usage_id = self.usage_id

        period = self.period

        at: None | str
        if isinstance(self.at, datetime.datetime):
            at = self.at.isoformat()
        else:
            at = self.at

        amount = self.amount

        from_allowance = self.from_allowance

        from_grants = []
        for from_grants_item_data in self.from_grants:
            from_grants_item = from_grants_item_data.to_dict()
            from_grants.append(from_grants_item)

        unfunded = self.unfunded

        order_version = self.order_version

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "usage_id": usage_id,
                "period": period,
                "at": at,
                "amount": amount,
                "from_allowance": from_allowance,
                "from_grants": from_grants,
                "unfunded": unfunded,
                "order_version": order_version,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.credit_debit_from_grants_item import CreditDebitFromGrantsItem

        d = dict(src_dict)
        usage_id = d.pop("usage_id")

        period = d.pop("period")

        def _parse_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                at_type_0 = datetime.datetime.fromisoformat(data)

                return at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        at = _parse_at(d.pop("at"))

        amount = d.pop("amount")

        from_allowance = d.pop("from_allowance")

        from_grants = []
        _from_grants = d.pop("from_grants")
        for from_grants_item_data in _from_grants:
            from_grants_item = CreditDebitFromGrantsItem.from_dict(
                from_grants_item_data
            )

            from_grants.append(from_grants_item)

        unfunded = d.pop("unfunded")

        order_version = cast(Literal[1], d.pop("order_version"))
        if order_version != 1:
            raise ValueError(f"order_version must match const 1, got '{order_version}'")

        credit_debit = cls(
            usage_id=usage_id,
            period=period,
            at=at,
            amount=amount,
            from_allowance=from_allowance,
            from_grants=from_grants,
            unfunded=unfunded,
            order_version=order_version,
        )

        return credit_debit
