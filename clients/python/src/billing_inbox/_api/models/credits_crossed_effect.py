from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.credits_crossed_effect_data import CreditsCrossedEffectData


T = TypeVar("T", bound="CreditsCrossedEffect")


@_attrs_define
class CreditsCrossedEffect:
    """
    Attributes:
        id (str):
        type_ (str): Known values: billing.credits_low, billing.credits_depleted (a client accepts others too).
        occurred_at (datetime.datetime):
        data (CreditsCrossedEffectData):
    """

    id: str
    type_: str
    occurred_at: datetime.datetime
    data: CreditsCrossedEffectData
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
        from ..models.credits_crossed_effect_data import CreditsCrossedEffectData

        d = dict(src_dict)
        id = d.pop("id")

        type_ = d.pop("type")

        occurred_at = datetime.datetime.fromisoformat(d.pop("occurred_at"))

        data = CreditsCrossedEffectData.from_dict(d.pop("data"))

        credits_crossed_effect = cls(
            id=id,
            type_=type_,
            occurred_at=occurred_at,
            data=data,
        )

        credits_crossed_effect.additional_properties = d
        return credits_crossed_effect

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
