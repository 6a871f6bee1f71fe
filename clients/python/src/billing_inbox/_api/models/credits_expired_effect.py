from __future__ import annotations

import datetime
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
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.credits_expired_effect_data import CreditsExpiredEffectData


T = TypeVar("T", bound="CreditsExpiredEffect")


@_attrs_define
class CreditsExpiredEffect:
    """
    Attributes:
        id (str):
        type_ (Literal['billing.credits_expired']):
        occurred_at (datetime.datetime):
        data (CreditsExpiredEffectData):
    """

    id: str
    type_: Literal["billing.credits_expired"]
    occurred_at: datetime.datetime
    data: CreditsExpiredEffectData
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        id = self.id

        type_ = self.type_

        occurred_at = self.occurred_at.isoformat()

        data = self.data.to_dict()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "id": id,
                "type": type_,
                "occurred_at": occurred_at,
                "data": data,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.credits_expired_effect_data import CreditsExpiredEffectData

        d = dict(src_dict)
        id = d.pop("id")

        type_ = cast(Literal["billing.credits_expired"], d.pop("type"))
        if type_ != "billing.credits_expired":
            raise ValueError(
                f"type must match const 'billing.credits_expired', got '{type_}'"
            )

        occurred_at = datetime.datetime.fromisoformat(d.pop("occurred_at"))

        data = CreditsExpiredEffectData.from_dict(d.pop("data"))

        credits_expired_effect = cls(
            id=id,
            type_=type_,
            occurred_at=occurred_at,
            data=data,
        )

        credits_expired_effect.additional_properties = d
        return credits_expired_effect

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
