from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

T = TypeVar("T", bound="AllowanceExhaustedEffectDataUsage")


@_attrs_define
class AllowanceExhaustedEffectDataUsage:
    """
    Attributes:
        usage_id (None | str): The debit that exhausted it; null when it was refused
        idempotency_key (str):
        amount (int):
        accepted (bool):
    """

    usage_id: None | str
    idempotency_key: str
    amount: int
    accepted: bool
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        usage_id: None | str
        usage_id = self.usage_id

        idempotency_key = self.idempotency_key

        amount = self.amount

        accepted = self.accepted

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "usage_id": usage_id,
                "idempotency_key": idempotency_key,
                "amount": amount,
                "accepted": accepted,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)

        def _parse_usage_id(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        usage_id = _parse_usage_id(d.pop("usage_id"))

        idempotency_key = d.pop("idempotency_key")

        amount = d.pop("amount")

        accepted = d.pop("accepted")

        allowance_exhausted_effect_data_usage = cls(
            usage_id=usage_id,
            idempotency_key=idempotency_key,
            amount=amount,
            accepted=accepted,
        )

        allowance_exhausted_effect_data_usage.additional_properties = d
        return allowance_exhausted_effect_data_usage

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
