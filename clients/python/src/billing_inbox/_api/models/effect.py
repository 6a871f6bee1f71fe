from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.credits_effect_data import CreditsEffectData
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
            data (CreditsEffectData | EffectData): Every kind's data, but the credits kinds', which carry no account block
    """

    id: str
    type_: str
    occurred_at: datetime.datetime
    data: CreditsEffectData | EffectData
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.effect_data import EffectData

        id = self.id

        type_ = self.type_

        occurred_at = self.occurred_at.isoformat()

        data: dict[str, Any]
        if isinstance(self.data, EffectData):
            data = self.data.to_dict()
        else:
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
        from ..models.credits_effect_data import CreditsEffectData
        from ..models.effect_data import EffectData

        d = dict(src_dict)
        id = d.pop("id")

        type_ = d.pop("type")

        occurred_at = datetime.datetime.fromisoformat(d.pop("occurred_at"))

        def _parse_data(data: object) -> CreditsEffectData | EffectData:
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                data_type_0 = EffectData.from_dict(data)

                return data_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            data_type_1 = CreditsEffectData.from_dict(data)

            return data_type_1

        data = _parse_data(d.pop("data"))

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
