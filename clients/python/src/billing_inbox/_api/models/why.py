from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.credit_balance_why import CreditBalanceWhy
    from ..models.why_field import WhyField


T = TypeVar("T", bound="Why")


@_attrs_define
class Why:
    """
    Attributes:
        source (str):
        customer_id (str): The customer as the provider names it (cus_… for a Connect customer)
        at (datetime.datetime | None): The cut asked for, if any
        received_before (datetime.datetime | None):
        fields (list[WhyField]): The derived plan first (its beaten: the other candidates and what its deciding register
            beat), then each feature the account has as feature:{key} (its value; decided_by the plan's event when the
            catalog gives it, else the entitlement event that does; beaten: the sources that give it less and the revoked
            grants that gave it), then the registers (customer_plan, customer_plan_key, standing, subscription:{id}:{field}
            for status, plan, plan_key, current_period_end, cancel_at_period_end, cancel_at, trial_end and ended_at,
            payment:{id}:status), allowance:{period}, entitlement:{grant} ({active, features}: a provider's entitlement
            grant), deleted and used:{period}
        purged (int): Events the purge took: the answer is whole only for times at or after complete_from
        complete_from (datetime.datetime | None):
        pending (list[int]): Events of the account not finished yet: the registers do not show them yet
        divergent (list[str]): Fields whose register differs from the fold (empty for a cut, which is not compared)
        credits_ (list[CreditBalanceWhy]): Each prepaid credit balance as of at (now without one), with the events
            behind it (each grant's, the one its register holds, and each transaction's counted) and the debits that spent
            its grants
        stripe_account (str | Unset): A Connect customer's connected account
    """

    source: str
    customer_id: str
    at: datetime.datetime | None
    received_before: datetime.datetime | None
    fields: list[WhyField]
    purged: int
    complete_from: datetime.datetime | None
    pending: list[int]
    divergent: list[str]
    credits_: list[CreditBalanceWhy]
    stripe_account: str | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        source = self.source

        customer_id = self.customer_id

        at: None | str
        if isinstance(self.at, datetime.datetime):
            at = self.at.isoformat()
        else:
            at = self.at

        received_before: None | str
        if isinstance(self.received_before, datetime.datetime):
            received_before = self.received_before.isoformat()
        else:
            received_before = self.received_before

        fields = []
        for fields_item_data in self.fields:
            fields_item = fields_item_data.to_dict()
            fields.append(fields_item)

        purged = self.purged

        complete_from: None | str
        if isinstance(self.complete_from, datetime.datetime):
            complete_from = self.complete_from.isoformat()
        else:
            complete_from = self.complete_from

        pending = self.pending

        divergent = self.divergent

        credits_ = []
        for credits_item_data in self.credits_:
            credits_item = credits_item_data.to_dict()
            credits_.append(credits_item)

        stripe_account = self.stripe_account

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "source": source,
                "customer_id": customer_id,
                "at": at,
                "received_before": received_before,
                "fields": fields,
                "purged": purged,
                "complete_from": complete_from,
                "pending": pending,
                "divergent": divergent,
                "credits": credits_,
            }
        )
        if stripe_account is not UNSET:
            field_dict["stripe_account"] = stripe_account

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.credit_balance_why import CreditBalanceWhy
        from ..models.why_field import WhyField

        d = dict(src_dict)
        source = d.pop("source")

        customer_id = d.pop("customer_id")

        def _parse_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                at_type_0 = datetime.datetime.fromisoformat(data)

                return at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        at = _parse_at(d.pop("at"))

        def _parse_received_before(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                received_before_type_0 = datetime.datetime.fromisoformat(data)

                return received_before_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        received_before = _parse_received_before(d.pop("received_before"))

        fields = []
        _fields = d.pop("fields")
        for fields_item_data in _fields:
            fields_item = WhyField.from_dict(fields_item_data)

            fields.append(fields_item)

        purged = d.pop("purged")

        def _parse_complete_from(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                complete_from_type_0 = datetime.datetime.fromisoformat(data)

                return complete_from_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        complete_from = _parse_complete_from(d.pop("complete_from"))

        pending = cast(list[int], d.pop("pending"))

        divergent = cast(list[str], d.pop("divergent"))

        credits_ = []
        _credits_ = d.pop("credits")
        for credits_item_data in _credits_:
            credits_item = CreditBalanceWhy.from_dict(credits_item_data)

            credits_.append(credits_item)

        stripe_account = d.pop("stripe_account", UNSET)

        why = cls(
            source=source,
            customer_id=customer_id,
            at=at,
            received_before=received_before,
            fields=fields,
            purged=purged,
            complete_from=complete_from,
            pending=pending,
            divergent=divergent,
            credits_=credits_,
            stripe_account=stripe_account,
        )

        return why
