from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="CreditBalance")


@_attrs_define
class CreditBalance:
    """
    Attributes:
        unit (str): A currency in its minor units (usd), a custom pricing unit's id, or credits
        scope (str): What the grants may pay for: all, price_type:metered, prices:<ids>
        available (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        granted (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        used (str): A decimal amount that may be below zero (a voided invoice gave back more than was applied since)
        expired (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
    """

    unit: str
    scope: str
    available: str
    granted: str
    used: str
    expired: str

    def to_dict(self) -> dict[str, Any]:
        unit = self.unit

        scope = self.scope

        available = self.available

        granted = self.granted

        used = self.used

        expired = self.expired

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "unit": unit,
                "scope": scope,
                "available": available,
                "granted": granted,
                "used": used,
                "expired": expired,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        unit = d.pop("unit")

        scope = d.pop("scope")

        available = d.pop("available")

        granted = d.pop("granted")

        used = d.pop("used")

        expired = d.pop("expired")

        credit_balance = cls(
            unit=unit,
            scope=scope,
            available=available,
            granted=granted,
            used=used,
            expired=expired,
        )

        return credit_balance
