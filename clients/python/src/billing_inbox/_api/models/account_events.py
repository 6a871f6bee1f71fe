from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.account_events_events_item import AccountEventsEventsItem


T = TypeVar("T", bound="AccountEvents")


@_attrs_define
class AccountEvents:
    """
    Attributes:
        events (list[AccountEventsEventsItem]):
        next_ (None | str):
    """

    events: list[AccountEventsEventsItem]
    next_: None | str

    def to_dict(self) -> dict[str, Any]:
        events = []
        for events_item_data in self.events:
            events_item = events_item_data.to_dict()
            events.append(events_item)

        next_: None | str
        next_ = self.next_

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "events": events,
                "next": next_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.account_events_events_item import AccountEventsEventsItem

        d = dict(src_dict)
        events = []
        _events = d.pop("events")
        for events_item_data in _events:
            events_item = AccountEventsEventsItem.from_dict(events_item_data)

            events.append(events_item)

        def _parse_next_(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        next_ = _parse_next_(d.pop("next"))

        account_events = cls(
            events=events,
            next_=next_,
        )

        return account_events
