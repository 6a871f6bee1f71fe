from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="CreditDebitFromGrantsItem")


@_attrs_define
class CreditDebitFromGrantsItem:
    """
    Attributes:
        grant_id (str): A Stripe credit grant's id, or a catalog pack's pack:{payment}:{price}
        origin (str): Known values: stripe_credit_grant, catalog_pack, polar_meter_credit (a client accepts others too).
        event_id (int | None): The event the grant's register holds (a pack's: the payment that bought it, or the refund
            that voided it), as events lists it
        amount (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
    """

    grant_id: str
    origin: str
    event_id: int | None
    amount: str

    def to_dict(self) -> dict[str, Any]:
        grant_id = self.grant_id

        origin = self.origin

        event_id: int | None
        event_id = self.event_id

        amount = self.amount

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "grant_id": grant_id,
                "origin": origin,
                "event_id": event_id,
                "amount": amount,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        grant_id = d.pop("grant_id")

        origin = d.pop("origin")

        def _parse_event_id(data: object) -> int | None:
            if data is None:
                return data
            return cast(int | None, data)

        event_id = _parse_event_id(d.pop("event_id"))

        amount = d.pop("amount")

        credit_debit_from_grants_item = cls(
            grant_id=grant_id,
            origin=origin,
            event_id=event_id,
            amount=amount,
        )

        return credit_debit_from_grants_item
