from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.usage_page_usage_item import UsagePageUsageItem


T = TypeVar("T", bound="UsagePage")


@_attrs_define
class UsagePage:
    """
    Attributes:
        period (str):
        allowance (int):
        used (int):
        remaining (int):
        usage (list[UsagePageUsageItem]):
        next_ (None | str): Pass as after for the next page; null on the last
    """

    period: str
    allowance: int
    used: int
    remaining: int
    usage: list[UsagePageUsageItem]
    next_: None | str

    def to_dict(self) -> dict[str, Any]:
        period = self.period

        allowance = self.allowance

        used = self.used

        remaining = self.remaining

        usage = []
        for usage_item_data in self.usage:
            usage_item = usage_item_data.to_dict()
            usage.append(usage_item)

        next_: None | str
        next_ = self.next_

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "period": period,
                "allowance": allowance,
                "used": used,
                "remaining": remaining,
                "usage": usage,
                "next": next_,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.usage_page_usage_item import UsagePageUsageItem

        d = dict(src_dict)
        period = d.pop("period")

        allowance = d.pop("allowance")

        used = d.pop("used")

        remaining = d.pop("remaining")

        usage = []
        _usage = d.pop("usage")
        for usage_item_data in _usage:
            usage_item = UsagePageUsageItem.from_dict(usage_item_data)

            usage.append(usage_item)

        def _parse_next_(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        next_ = _parse_next_(d.pop("next"))

        usage_page = cls(
            period=period,
            allowance=allowance,
            used=used,
            remaining=remaining,
            usage=usage,
            next_=next_,
        )

        return usage_page
