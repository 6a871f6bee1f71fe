from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="CreditsCrossedEffectData")


@_attrs_define
class CreditsCrossedEffectData:
    """
    Attributes:
        source (str):
        customer_id (str):
        sequence (int):
        unit (str):
        level (None | str): The low level crossed (a decimal string); null for depleted
        crossed_at (datetime.datetime):
    """

    source: str
    customer_id: str
    sequence: int
    unit: str
    level: None | str
    crossed_at: datetime.datetime
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        source = self.source

        customer_id = self.customer_id

        sequence = self.sequence

        unit = self.unit

        level: None | str
        level = self.level

        crossed_at = self.crossed_at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "source": source,
                "customer_id": customer_id,
                "sequence": sequence,
                "unit": unit,
                "level": level,
                "crossed_at": crossed_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        source = d.pop("source")

        customer_id = d.pop("customer_id")

        sequence = d.pop("sequence")

        unit = d.pop("unit")

        def _parse_level(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        level = _parse_level(d.pop("level"))

        crossed_at = datetime.datetime.fromisoformat(d.pop("crossed_at"))

        credits_crossed_effect_data = cls(
            source=source,
            customer_id=customer_id,
            sequence=sequence,
            unit=unit,
            level=level,
            crossed_at=crossed_at,
        )

        credits_crossed_effect_data.additional_properties = d
        return credits_crossed_effect_data

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
