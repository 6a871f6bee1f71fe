from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="CreditGrantTold")


@_attrs_define
class CreditGrantTold:
    """The grant's own fields, which no later event changes

    Attributes:
        grant_id (str): Stripe's credgr_…, or pack:{payment}:{price} for a catalog pack
        origin (str): Known values: stripe_credit_grant, catalog_pack, polar_meter_credit (a client accepts others too).
        unit (str): A currency (minor units), a custom pricing unit's id, or credits
        scope (str):
        amount (str): A decimal string
        category (str): Known values: paid, promotional (a client accepts others too).
        effective_at (datetime.datetime):
    """

    grant_id: str
    origin: str
    unit: str
    scope: str
    amount: str
    category: str
    effective_at: datetime.datetime
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        grant_id = self.grant_id

        origin = self.origin

        unit = self.unit

        scope = self.scope

        amount = self.amount

        category = self.category

        effective_at = self.effective_at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "grant_id": grant_id,
                "origin": origin,
                "unit": unit,
                "scope": scope,
                "amount": amount,
                "category": category,
                "effective_at": effective_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        grant_id = d.pop("grant_id")

        origin = d.pop("origin")

        unit = d.pop("unit")

        scope = d.pop("scope")

        amount = d.pop("amount")

        category = d.pop("category")

        effective_at = datetime.datetime.fromisoformat(d.pop("effective_at"))

        credit_grant_told = cls(
            grant_id=grant_id,
            origin=origin,
            unit=unit,
            scope=scope,
            amount=amount,
            category=category,
            effective_at=effective_at,
        )

        credit_grant_told.additional_properties = d
        return credit_grant_told

    @property
    def additional_keys(self) -> list[str]:
        return list(self.additional_properties.keys())

    def __getitem__(self, key: str) -> Any:
        return self.additional_properties[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.additional_properties[key] = value

    def __delitem__(self, key: str) -> None:
        del self.additional_properties[key]

    def __contains__(self, key: str) -> bool:
        return key in self.additional_properties
