from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="ExhaustedGrantsItem")


@_attrs_define
class ExhaustedGrantsItem:
    """
    Attributes:
        grant_id (str):
        remaining (str): An amount as a decimal string, exact to 12 places (a grant's unit may be a decimal)
    """

    grant_id: str
    remaining: str

    def to_dict(self) -> dict[str, Any]:
        grant_id = self.grant_id

        remaining = self.remaining

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "grant_id": grant_id,
                "remaining": remaining,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        grant_id = d.pop("grant_id")

        remaining = d.pop("remaining")

        exhausted_grants_item = cls(
            grant_id=grant_id,
            remaining=remaining,
        )

        return exhausted_grants_item
