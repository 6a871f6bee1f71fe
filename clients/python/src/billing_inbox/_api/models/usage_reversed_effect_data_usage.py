from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="UsageReversedEffectDataUsage")


@_attrs_define
class UsageReversedEffectDataUsage:
    """
    Attributes:
        usage_id (str):
        idempotency_key (str):
        amount (int):
        period (str):
        reversed_at (datetime.datetime):
    """

    usage_id: str
    idempotency_key: str
    amount: int
    period: str
    reversed_at: datetime.datetime
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        usage_id = self.usage_id

        idempotency_key = self.idempotency_key

        amount = self.amount

        period = self.period

        reversed_at = self.reversed_at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "usage_id": usage_id,
                "idempotency_key": idempotency_key,
                "amount": amount,
                "period": period,
                "reversed_at": reversed_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        usage_id = d.pop("usage_id")

        idempotency_key = d.pop("idempotency_key")

        amount = d.pop("amount")

        period = d.pop("period")

        reversed_at = datetime.datetime.fromisoformat(d.pop("reversed_at"))

        usage_reversed_effect_data_usage = cls(
            usage_id=usage_id,
            idempotency_key=idempotency_key,
            amount=amount,
            period=period,
            reversed_at=reversed_at,
        )

        usage_reversed_effect_data_usage.additional_properties = d
        return usage_reversed_effect_data_usage

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
