from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.effect_data import EffectData


T = TypeVar("T", bound="Effect")


@_attrs_define
class Effect:
    """Every effect's envelope. A type the app does not know is a fact: applied once by id, never dropped (docs/effects.md,
    States and facts).

        Attributes:
            id (str): The effect id
            type_ (str):
            occurred_at (datetime.datetime):
            data (EffectData): What every effect's data holds, before the fields of its type (docs/effects.md, The body)
    """

    id: str
    type_: str
    occurred_at: datetime.datetime
    data: EffectData
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
        from ..models.effect_data import EffectData

        d = dict(src_dict)
        id = d.pop("id")

        type_ = d.pop("type")

        occurred_at = datetime.datetime.fromisoformat(d.pop("occurred_at"))

        data = EffectData.from_dict(d.pop("data"))

        effect = cls(
            id=id,
            type_=type_,
            occurred_at=occurred_at,
            data=data,
        )

        effect.additional_properties = d
        return effect

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
