from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="FeaturesChangedEffectDataChangedItem")


@_attrs_define
class FeaturesChangedEffectDataChangedItem:
    """
    Attributes:
        key (str):
        from_ (bool | int | str): A flag, a whole number (a limit) or a string (a tier)
        to (bool | int | str): A flag, a whole number (a limit) or a string (a tier)
    """

    key: str
    from_: bool | int | str
    to: bool | int | str
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        key = self.key

        from_: bool | int | str
        from_ = self.from_

        to: bool | int | str
        to = self.to

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "key": key,
                "from": from_,
                "to": to,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        key = d.pop("key")

        def _parse_from_(data: object) -> bool | int | str:
            return cast(bool | int | str, data)

        from_ = _parse_from_(d.pop("from"))

        def _parse_to(data: object) -> bool | int | str:
            return cast(bool | int | str, data)

        to = _parse_to(d.pop("to"))

        features_changed_effect_data_changed_item = cls(
            key=key,
            from_=from_,
            to=to,
        )

        features_changed_effect_data_changed_item.additional_properties = d
        return features_changed_effect_data_changed_item

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
