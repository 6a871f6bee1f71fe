from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.credit_debit import CreditDebit
    from ..models.credit_event import CreditEvent


T = TypeVar("T", bound="CreditBalanceWhy")


@_attrs_define
class CreditBalanceWhy:
    """A CreditBalance with the events behind it and the app's debits that spent its grants

    Attributes:
        unit (str):
        scope (str):
        available (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        granted (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        used (str): A decimal amount that may be below zero (a voided invoice gave back more than was applied since)
        expired (str): A decimal amount, exact, as a string: no exponent, no trailing zeros
        events (list[CreditEvent]):
        debits (list[CreditDebit]): Each accepted debit (not reversed, accepted by the time read) that took from a grant
            of this balance, in the order debits were accepted, with what it took as derived from everything known: a grant
            told later that comes first in the burn order moves it, while the debit's own answer stays as given.
    """

    unit: str
    scope: str
    available: str
    granted: str
    used: str
    expired: str
    events: list[CreditEvent]
    debits: list[CreditDebit]

    def to_dict(self) -> dict[str, Any]:
        unit = self.unit

        scope = self.scope

        available = self.available

        granted = self.granted

        used = self.used

        expired = self.expired

        events = []
        for events_item_data in self.events:
            events_item = events_item_data.to_dict()
            events.append(events_item)

        debits = []
        for debits_item_data in self.debits:
            debits_item = debits_item_data.to_dict()
            debits.append(debits_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "unit": unit,
                "scope": scope,
                "available": available,
                "granted": granted,
                "used": used,
                "expired": expired,
                "events": events,
                "debits": debits,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.credit_debit import CreditDebit
        from ..models.credit_event import CreditEvent

        d = dict(src_dict)
        unit = d.pop("unit")

        scope = d.pop("scope")

        available = d.pop("available")

        granted = d.pop("granted")

        used = d.pop("used")

        expired = d.pop("expired")

        events = []
        _events = d.pop("events")
        for events_item_data in _events:
            events_item = CreditEvent.from_dict(events_item_data)

            events.append(events_item)

        debits = []
        _debits = d.pop("debits")
        for debits_item_data in _debits:
            debits_item = CreditDebit.from_dict(debits_item_data)

            debits.append(debits_item)

        credit_balance_why = cls(
            unit=unit,
            scope=scope,
            available=available,
            granted=granted,
            used=used,
            expired=expired,
            events=events,
            debits=debits,
        )

        return credit_balance_why
