from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

if TYPE_CHECKING:
    from ..models.credit_grant_told import CreditGrantTold


T = TypeVar("T", bound="CreditsExpiredEffectData")


@_attrs_define
class CreditsExpiredEffectData:
    """
    Attributes:
        source (str):
        customer_id (str):
        sequence (int):
        grant (CreditGrantTold): The grant's own fields, which no later event changes
        expired_at (datetime.datetime):
    """

    source: str
    customer_id: str
    sequence: int
    grant: CreditGrantTold
    expired_at: datetime.datetime
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        source = self.source

        customer_id = self.customer_id

        sequence = self.sequence

        grant = self.grant.to_dict()

        expired_at = self.expired_at.isoformat()

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "source": source,
                "customer_id": customer_id,
                "sequence": sequence,
                "grant": grant,
                "expired_at": expired_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.credit_grant_told import CreditGrantTold

        d = dict(src_dict)
        source = d.pop("source")

        customer_id = d.pop("customer_id")

        sequence = d.pop("sequence")

        grant = CreditGrantTold.from_dict(d.pop("grant"))

        expired_at = datetime.datetime.fromisoformat(d.pop("expired_at"))

        credits_expired_effect_data = cls(
            source=source,
            customer_id=customer_id,
            sequence=sequence,
            grant=grant,
            expired_at=expired_at,
        )

        credits_expired_effect_data.additional_properties = d
        return credits_expired_effect_data

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
