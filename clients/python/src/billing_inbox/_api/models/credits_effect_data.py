from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="CreditsEffectData")


@_attrs_define
class CreditsEffectData:
    """What a credits effect's data holds (docs/effects.md, Credits): no account block, since an expiry or a crossing may
    be told with no event; the balances are GET …/credits'

        Attributes:
            source (str):
            customer_id (str):
            sequence (int):
    """

    source: str
    customer_id: str
    sequence: int
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        source = self.source

        customer_id = self.customer_id

        sequence = self.sequence

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "source": source,
                "customer_id": customer_id,
                "sequence": sequence,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        source = d.pop("source")

        customer_id = d.pop("customer_id")

        sequence = d.pop("sequence")

        credits_effect_data = cls(
            source=source,
            customer_id=customer_id,
            sequence=sequence,
        )

        credits_effect_data.additional_properties = d
        return credits_effect_data

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
