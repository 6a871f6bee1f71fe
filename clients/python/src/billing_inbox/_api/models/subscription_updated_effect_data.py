from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.effect_account import EffectAccount
    from ..models.effect_subscription_state import EffectSubscriptionState


T = TypeVar("T", bound="SubscriptionUpdatedEffectData")


@_attrs_define
class SubscriptionUpdatedEffectData:
    """
    Attributes:
        source (str): The configured source
        customer_id (str): The provider's customer id
        sequence (int): This account's effect number, in the order the changes took effect
        account (EffectAccount): The account after the change (a state on every kind: keep the one with the highest
            sequence): the derived plan, its features, the allowance (balance) of period, what the app's debits spent of it
            and what is left
        subscription (EffectSubscriptionState): A subscription's state as an effect tells it; the ends are null (false)
            where the provider says nothing
        previous (EffectSubscriptionState | None): The state before; null for a subscription seen for the first time
        event_id (int | Unset): The stored event that caused it; absent from allowance_exhausted and usage_reversed
        provider_event_id (str | Unset): The provider's id of that event; absent where event_id is
    """

    source: str
    customer_id: str
    sequence: int
    account: EffectAccount
    subscription: EffectSubscriptionState
    previous: EffectSubscriptionState | None
    event_id: int | Unset = UNSET
    provider_event_id: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from ..models.effect_subscription_state import EffectSubscriptionState

        source = self.source

        customer_id = self.customer_id

        sequence = self.sequence

        account = self.account.to_dict()

        subscription = self.subscription.to_dict()

        previous: dict[str, Any] | None
        if isinstance(self.previous, EffectSubscriptionState):
            previous = self.previous.to_dict()
        else:
            previous = self.previous

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
                "subscription": subscription,
                "previous": previous,
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
        from ..models.effect_subscription_state import EffectSubscriptionState

        d = dict(src_dict)
        source = d.pop("source")

        customer_id = d.pop("customer_id")

        sequence = d.pop("sequence")

        account = EffectAccount.from_dict(d.pop("account"))

        subscription = EffectSubscriptionState.from_dict(d.pop("subscription"))

        def _parse_previous(data: object) -> EffectSubscriptionState | None:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                previous_type_0 = EffectSubscriptionState.from_dict(data)

                return previous_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(EffectSubscriptionState | None, data)

        previous = _parse_previous(d.pop("previous"))

        event_id = d.pop("event_id", UNSET)

        provider_event_id = d.pop("provider_event_id", UNSET)

        subscription_updated_effect_data = cls(
            source=source,
            customer_id=customer_id,
            sequence=sequence,
            account=account,
            subscription=subscription,
            previous=previous,
            event_id=event_id,
            provider_event_id=provider_event_id,
        )

        subscription_updated_effect_data.additional_properties = d
        return subscription_updated_effect_data

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
