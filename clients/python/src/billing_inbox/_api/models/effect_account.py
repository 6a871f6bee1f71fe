from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.features import Features


T = TypeVar("T", bound="EffectAccount")


@_attrs_define
class EffectAccount:
    """The account after the change (a state on every kind: keep the one with the highest sequence): the derived plan, its
    features, the allowance (balance) of period, what the app's debits spent of it and what is left

        Attributes:
            plan (str):
            period (str):
            features (Features | Unset): What the customer may use, by key: the catalog's features of its plan joined with
                the provider's active entitlements, the larger value winning for a key both give (docs/design.md §4.12). Empty
                for a deleted customer.
            balance (int | Unset):
            used (int | Unset):
            remaining (int | Unset):
    """

    plan: str
    period: str
    features: Features | Unset = UNSET
    balance: int | Unset = UNSET
    used: int | Unset = UNSET
    remaining: int | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan

        period = self.period

        features: dict[str, Any] | Unset = UNSET
        if not isinstance(self.features, Unset):
            features = self.features.to_dict()

        balance = self.balance

        used = self.used

        remaining = self.remaining

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "plan": plan,
                "period": period,
            }
        )
        if features is not UNSET:
            field_dict["features"] = features
        if balance is not UNSET:
            field_dict["balance"] = balance
        if used is not UNSET:
            field_dict["used"] = used
        if remaining is not UNSET:
            field_dict["remaining"] = remaining

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.features import Features

        d = dict(src_dict)
        plan = d.pop("plan")

        period = d.pop("period")

        _features = d.pop("features", UNSET)
        features: Features | Unset
        if isinstance(_features, Unset):
            features = UNSET
        else:
            features = Features.from_dict(_features)

        balance = d.pop("balance", UNSET)

        used = d.pop("used", UNSET)

        remaining = d.pop("remaining", UNSET)

        effect_account = cls(
            plan=plan,
            period=period,
            features=features,
            balance=balance,
            used=used,
            remaining=remaining,
        )

        effect_account.additional_properties = d
        return effect_account

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
