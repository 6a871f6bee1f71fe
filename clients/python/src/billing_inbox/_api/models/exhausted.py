from __future__ import annotations

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

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.exhausted_grants_item import ExhaustedGrantsItem


T = TypeVar("T", bound="Exhausted")


@_attrs_define
class Exhausted:
    """
    Attributes:
        code (Literal['allowance_exhausted']):
        detail (str):
        remaining (int): What the period's allowance had left
        grants (list[ExhaustedGrantsItem] | Unset): Each grant of the debit's unit that had anything left, in the burn
            order, and what it had (absent from a refusal stored before debits burned grants)
    """

    code: Literal["allowance_exhausted"]
    detail: str
    remaining: int
    grants: list[ExhaustedGrantsItem] | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        code = self.code

        detail = self.detail

        remaining = self.remaining

        grants: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.grants, Unset):
            grants = []
            for grants_item_data in self.grants:
                grants_item = grants_item_data.to_dict()
                grants.append(grants_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "code": code,
                "detail": detail,
                "remaining": remaining,
            }
        )
        if grants is not UNSET:
            field_dict["grants"] = grants

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.exhausted_grants_item import ExhaustedGrantsItem

        d = dict(src_dict)
        code = cast(Literal["allowance_exhausted"], d.pop("code"))
        if code != "allowance_exhausted":
            raise ValueError(
                f"code must match const 'allowance_exhausted', got '{code}'"
            )

        detail = d.pop("detail")

        remaining = d.pop("remaining")

        _grants = d.pop("grants", UNSET)
        grants: list[ExhaustedGrantsItem] | Unset = UNSET
        if _grants is not UNSET:
            grants = []
            for grants_item_data in _grants:
                grants_item = ExhaustedGrantsItem.from_dict(grants_item_data)

                grants.append(grants_item)

        exhausted = cls(
            code=code,
            detail=detail,
            remaining=remaining,
            grants=grants,
        )

        return exhausted
