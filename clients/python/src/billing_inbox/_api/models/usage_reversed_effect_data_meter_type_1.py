from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="UsageReversedEffectDataMeterType1")


@_attrs_define
class UsageReversedEffectDataMeterType1:
    """
    Attributes:
        report_id (str):
        correction (str): Known values: withdrawn, correcting (a client accepts others too).
        correction_id (str | Unset):
    """

    report_id: str
    correction: str
    correction_id: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        report_id = self.report_id

        correction = self.correction

        correction_id = self.correction_id

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "report_id": report_id,
                "correction": correction,
            }
        )
        if correction_id is not UNSET:
            field_dict["correction_id"] = correction_id

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        report_id = d.pop("report_id")

        correction = d.pop("correction")

        correction_id = d.pop("correction_id", UNSET)

        usage_reversed_effect_data_meter_type_1 = cls(
            report_id=report_id,
            correction=correction,
            correction_id=correction_id,
        )

        usage_reversed_effect_data_meter_type_1.additional_properties = d
        return usage_reversed_effect_data_meter_type_1

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
