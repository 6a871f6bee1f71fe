from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="CreditGrant")


@_attrs_define
class CreditGrant:
    """
    Attributes:
        grant_id (str): credgr_… for Stripe; pack:{payment}:{price} for a catalog pack
        origin (str): Where the grant comes from; each is its own source in why
        unit (str):
        scope (str):
        amount (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        remaining (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        priority (int): 0 is spent first; Stripe's default is 50
        category (str):
        effective_at (datetime.datetime | None):
        expires_at (datetime.datetime | None):
        voided_at (datetime.datetime | None):
        provisional (bool): The figures count an amount, an expiry or a void the provider has not told yet
    """

    grant_id: str
    origin: str
    unit: str
    scope: str
    amount: str
    remaining: str
    priority: int
    category: str
    effective_at: datetime.datetime | None
    expires_at: datetime.datetime | None
    voided_at: datetime.datetime | None
    provisional: bool

    def to_dict(self) -> dict[str, Any]:
        grant_id = self.grant_id

        origin = self.origin

        unit = self.unit

        scope = self.scope

        amount = self.amount

        remaining = self.remaining

        priority = self.priority

        category = self.category

        effective_at: None | str
        if isinstance(self.effective_at, datetime.datetime):
            effective_at = self.effective_at.isoformat()
        else:
            effective_at = self.effective_at

        expires_at: None | str
        if isinstance(self.expires_at, datetime.datetime):
            expires_at = self.expires_at.isoformat()
        else:
            expires_at = self.expires_at

        voided_at: None | str
        if isinstance(self.voided_at, datetime.datetime):
            voided_at = self.voided_at.isoformat()
        else:
            voided_at = self.voided_at

        provisional = self.provisional

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "grant_id": grant_id,
                "origin": origin,
                "unit": unit,
                "scope": scope,
                "amount": amount,
                "remaining": remaining,
                "priority": priority,
                "category": category,
                "effective_at": effective_at,
                "expires_at": expires_at,
                "voided_at": voided_at,
                "provisional": provisional,
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

        remaining = d.pop("remaining")

        priority = d.pop("priority")

        category = d.pop("category")

        def _parse_effective_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                effective_at_type_0 = datetime.datetime.fromisoformat(data)

                return effective_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        effective_at = _parse_effective_at(d.pop("effective_at"))

        def _parse_expires_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                expires_at_type_0 = datetime.datetime.fromisoformat(data)

                return expires_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        expires_at = _parse_expires_at(d.pop("expires_at"))

        def _parse_voided_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                voided_at_type_0 = datetime.datetime.fromisoformat(data)

                return voided_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        voided_at = _parse_voided_at(d.pop("voided_at"))

        provisional = d.pop("provisional")

        credit_grant = cls(
            grant_id=grant_id,
            origin=origin,
            unit=unit,
            scope=scope,
            amount=amount,
            remaining=remaining,
            priority=priority,
            category=category,
            effective_at=effective_at,
            expires_at=expires_at,
            voided_at=voided_at,
            provisional=provisional,
        )

        return credit_grant
