from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.credit_balance import CreditBalance
    from ..models.features import Features
    from ..models.subscription import Subscription


T = TypeVar("T", bound="Account")


@_attrs_define
class Account:
    """
    Attributes:
        source (str):
        customer_id (str): The customer as the provider names it (cus_… for a Connect customer, acct_… for a Stripe
            customer that is an Account)
        plan (str): The catalog's plan name; free when nothing entitles the customer
        entitled (bool): Whether a plan other than free is held
        deleted (bool):
        period (str):
        allowance (int): The largest allowance granted in the period
        used (int): The sum of the period's accepted debits
        remaining (int):
        subscriptions (list[Subscription]):
        features (Features): What the customer may use, by key: the catalog's features of its plan joined with the
            provider's active entitlements, the larger value winning for a key both give (docs/design.md §4.12). Empty for a
            deleted customer.
        version (int): Grows whenever the account's state moves
        stripe_account (str | Unset): A Connect customer's connected account
        credits_ (list[CreditBalance] | Unset): Prepaid credit per unit and scope as of the store's clock, as GET
            …/credits gives its balances
    """

    source: str
    customer_id: str
    plan: str
    entitled: bool
    deleted: bool
    period: str
    allowance: int
    used: int
    remaining: int
    subscriptions: list[Subscription]
    features: Features
    version: int
    stripe_account: str | Unset = UNSET
    credits_: list[CreditBalance] | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        source = self.source

        customer_id = self.customer_id

        plan = self.plan

        entitled = self.entitled

        deleted = self.deleted

        period = self.period

        allowance = self.allowance

        used = self.used

        remaining = self.remaining

        subscriptions = []
        for subscriptions_item_data in self.subscriptions:
            subscriptions_item = subscriptions_item_data.to_dict()
            subscriptions.append(subscriptions_item)

        features = self.features.to_dict()

        version = self.version

        stripe_account = self.stripe_account

        credits_: list[dict[str, Any]] | Unset = UNSET
        if not isinstance(self.credits_, Unset):
            credits_ = []
            for credits_item_data in self.credits_:
                credits_item = credits_item_data.to_dict()
                credits_.append(credits_item)

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "source": source,
                "customer_id": customer_id,
                "plan": plan,
                "entitled": entitled,
                "deleted": deleted,
                "period": period,
                "allowance": allowance,
                "used": used,
                "remaining": remaining,
                "subscriptions": subscriptions,
                "features": features,
                "version": version,
            }
        )
        if stripe_account is not UNSET:
            field_dict["stripe_account"] = stripe_account
        if credits_ is not UNSET:
            field_dict["credits"] = credits_

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.credit_balance import CreditBalance
        from ..models.features import Features
        from ..models.subscription import Subscription

        d = dict(src_dict)
        source = d.pop("source")

        customer_id = d.pop("customer_id")

        plan = d.pop("plan")

        entitled = d.pop("entitled")

        deleted = d.pop("deleted")

        period = d.pop("period")

        allowance = d.pop("allowance")

        used = d.pop("used")

        remaining = d.pop("remaining")

        subscriptions = []
        _subscriptions = d.pop("subscriptions")
        for subscriptions_item_data in _subscriptions:
            subscriptions_item = Subscription.from_dict(subscriptions_item_data)

            subscriptions.append(subscriptions_item)

        features = Features.from_dict(d.pop("features"))

        version = d.pop("version")

        stripe_account = d.pop("stripe_account", UNSET)

        _credits_ = d.pop("credits", UNSET)
        credits_: list[CreditBalance] | Unset = UNSET
        if _credits_ is not UNSET:
            credits_ = []
            for credits_item_data in _credits_:
                credits_item = CreditBalance.from_dict(credits_item_data)

                credits_.append(credits_item)

        account = cls(
            source=source,
            customer_id=customer_id,
            plan=plan,
            entitled=entitled,
            deleted=deleted,
            period=period,
            allowance=allowance,
            used=used,
            remaining=remaining,
            subscriptions=subscriptions,
            features=features,
            version=version,
            stripe_account=stripe_account,
            credits_=credits_,
        )

        return account
