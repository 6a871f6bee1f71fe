from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define
from attrs import field as _attrs_field

from ..types import UNSET, Unset

T = TypeVar("T", bound="EffectSubscriptionState")


@_attrs_define
class EffectSubscriptionState:
    """A subscription's state as an effect tells it; the ends are null (false) where the provider says nothing

    Attributes:
        status (str):
        plan (None | str):
        current_period_end (datetime.datetime | None):
        cancel_at_period_end (bool | None):
        cancel_at (datetime.datetime | None):
        trial_end (datetime.datetime | None):
        ended_at (datetime.datetime | None):
        id (str | Unset): Present on the state after the change
    """

    status: str
    plan: None | str
    current_period_end: datetime.datetime | None
    cancel_at_period_end: bool | None
    cancel_at: datetime.datetime | None
    trial_end: datetime.datetime | None
    ended_at: datetime.datetime | None
    id: str | Unset = UNSET
    additional_properties: dict[str, Any] = _attrs_field(init=False, factory=dict)

    def to_dict(self) -> dict[str, Any]:
        status = self.status

        plan: None | str
        plan = self.plan

        current_period_end: None | str
        if isinstance(self.current_period_end, datetime.datetime):
            current_period_end = self.current_period_end.isoformat()
        else:
            current_period_end = self.current_period_end

        cancel_at_period_end: bool | None
        cancel_at_period_end = self.cancel_at_period_end

        cancel_at: None | str
        if isinstance(self.cancel_at, datetime.datetime):
            cancel_at = self.cancel_at.isoformat()
        else:
            cancel_at = self.cancel_at

        trial_end: None | str
        if isinstance(self.trial_end, datetime.datetime):
            trial_end = self.trial_end.isoformat()
        else:
            trial_end = self.trial_end

        ended_at: None | str
        if isinstance(self.ended_at, datetime.datetime):
            ended_at = self.ended_at.isoformat()
        else:
            ended_at = self.ended_at

        id = self.id

        field_dict: dict[str, Any] = {}
        field_dict.update(self.additional_properties)
        field_dict.update(
            {
                "status": status,
                "plan": plan,
                "current_period_end": current_period_end,
                "cancel_at_period_end": cancel_at_period_end,
                "cancel_at": cancel_at,
                "trial_end": trial_end,
                "ended_at": ended_at,
            }
        )
        if id is not UNSET:
            field_dict["id"] = id

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        status = d.pop("status")

        def _parse_plan(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        plan = _parse_plan(d.pop("plan"))

        def _parse_current_period_end(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                current_period_end_type_0 = datetime.datetime.fromisoformat(data)

                return current_period_end_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        current_period_end = _parse_current_period_end(d.pop("current_period_end"))

        def _parse_cancel_at_period_end(data: object) -> bool | None:
            if data is None:
                return data
            return cast(bool | None, data)

        cancel_at_period_end = _parse_cancel_at_period_end(
            d.pop("cancel_at_period_end")
        )

        def _parse_cancel_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                cancel_at_type_0 = datetime.datetime.fromisoformat(data)

                return cancel_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        cancel_at = _parse_cancel_at(d.pop("cancel_at"))

        def _parse_trial_end(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                trial_end_type_0 = datetime.datetime.fromisoformat(data)

                return trial_end_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        trial_end = _parse_trial_end(d.pop("trial_end"))

        def _parse_ended_at(data: object) -> datetime.datetime | None:
            if data is None:
                return data
            try:
                if not isinstance(data, str):
                    raise TypeError()
                ended_at_type_0 = datetime.datetime.fromisoformat(data)

                return ended_at_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(datetime.datetime | None, data)

        ended_at = _parse_ended_at(d.pop("ended_at"))

        id = d.pop("id", UNSET)

        effect_subscription_state = cls(
            status=status,
            plan=plan,
            current_period_end=current_period_end,
            cancel_at_period_end=cancel_at_period_end,
            cancel_at=cancel_at,
            trial_end=trial_end,
            ended_at=ended_at,
            id=id,
        )

        effect_subscription_state.additional_properties = d
        return effect_subscription_state

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
