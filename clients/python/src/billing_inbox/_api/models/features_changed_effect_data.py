from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.effect_account import EffectAccount
    from ..models.features import Features
    from ..models.features_changed_effect_data_changed_item import (
        FeaturesChangedEffectDataChangedItem,
    )


T = TypeVar("T", bound="FeaturesChangedEffectData")


@_attrs_define
class FeaturesChangedEffectData:
    """
    Attributes:
        source (str): The configured source
        customer_id (str): The provider's customer id
        sequence (int): This account's effect number, in the order the changes took effect
        account (EffectAccount): The account after the change (a state on every kind: keep the one with the highest
            sequence): the derived plan, its features, the allowance (balance) of period, what the app's debits spent of it
            and what is left
        added (list[str]):
        removed (list[str]):
        changed (list[FeaturesChangedEffectDataChangedItem]):
        features (Features): What the customer may use, by key: the catalog's features of its plan joined with the
            provider's active entitlements, the larger value winning for a key both give (docs/design.md §4.12). Empty for a
            deleted customer.
        event_id (int | Unset): The stored event that caused it; absent from allowance_exhausted and usage_reversed
        provider_event_id (str | Unset): The provider's id of that event; absent where event_id is
    """

    source: str
    customer_id: str
    sequence: int
    account: EffectAccount
    added: list[str]
    removed: list[str]
    changed: list[FeaturesChangedEffectDataChangedItem]
    features: Features
    event_id: int | Unset = UNSET
    provider_event_id: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        source = self.source

        customer_id = self.customer_id

        sequence = self.sequence

        account = self.account.to_dict()

        added = self.added

        removed = self.removed

        changed = []
        for changed_item_data in self.changed:
            changed_item = changed_item_data.to_dict()
            changed.append(changed_item)

        features = self.features.to_dict()

        event_id = self.event_id

        provider_event_id = self.provider_event_id

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "source": source,
                "customer_id": customer_id,
                "sequence": sequence,
                "account": account,
                "added": added,
                "removed": removed,
                "changed": changed,
                "features": features,
            }
        )
        if event_id is not UNSET:
            field_dict["event_id"] = event_id
        if provider_event_id is not UNSET:
            field_dict["provider_event_id"] = provider_event_id

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.effect_account import EffectAccount
        from ..models.features import Features
        from ..models.features_changed_effect_data_changed_item import (
            FeaturesChangedEffectDataChangedItem,
        )

        d = dict(src_dict)
        source = d.pop("source")

        customer_id = d.pop("customer_id")

        sequence = d.pop("sequence")

        account = EffectAccount.from_dict(d.pop("account"))

        added = cast(list[str], d.pop("added"))

        removed = cast(list[str], d.pop("removed"))

        changed = []
        _changed = d.pop("changed")
        for changed_item_data in _changed:
            changed_item = FeaturesChangedEffectDataChangedItem.from_dict(
                changed_item_data
            )

            changed.append(changed_item)

        features = Features.from_dict(d.pop("features"))

        event_id = d.pop("event_id", UNSET)

        provider_event_id = d.pop("provider_event_id", UNSET)

        features_changed_effect_data = cls(
            source=source,
            customer_id=customer_id,
            sequence=sequence,
            account=account,
            added=added,
            removed=removed,
            changed=changed,
            features=features,
            event_id=event_id,
            provider_event_id=provider_event_id,
        )

        features_changed_effect_data.additional_properties = d
        return features_changed_effect_data

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
