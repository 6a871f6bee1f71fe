from __future__ import annotations

from collections.abc import Mapping
from typing import (
    Any,
    Literal,
    Self,
    TypeVar,
    cast,
)

from attrs import define as _attrs_define

T = TypeVar("T", bound="Exhausted")


@_attrs_define
class Exhausted:
    """
    Attributes:
        code (Literal['allowance_exhausted']):
        detail (str):
        remaining (int):
    """

    code: Literal["allowance_exhausted"]
    detail: str
    remaining: int

    def to_dict(self) -> dict[str, Any]:
        code = self.code

        detail = self.detail

        remaining = self.remaining

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "code": code,
                "detail": detail,
                "remaining": remaining,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        code = cast(Literal["allowance_exhausted"], d.pop("code"))
        if code != "allowance_exhausted":
            raise ValueError(
                f"code must match const 'allowance_exhausted', got '{code}'"
            )

        detail = d.pop("detail")

        remaining = d.pop("remaining")

        exhausted = cls(
            code=code,
            detail=detail,
            remaining=remaining,
        )

        return exhausted
