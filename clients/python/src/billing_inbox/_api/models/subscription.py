from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Self, TypeVar, cast

from attrs import define as _attrs_define

T = TypeVar("T", bound="Subscription")


@_attrs_define
class Subscription:
    """
    Attributes:
        id (str):
        status (str):
        plan (None | str):
        current_period_end (datetime.datetime | None):
        cancel_at_period_end (bool | None):
        cancel_at (datetime.datetime | None):
        trial_end (datetime.datetime | None):
        ended_at (datetime.datetime | None):
    """

    id: str
    status: str
    plan: None | str
    current_period_end: datetime.datetime | None
    cancel_at_period_end: bool | None
    cancel_at: datetime.datetime | None
    trial_end: datetime.datetime | None
    ended_at: datetime.datetime | None

    def to_dict(self) -> dict[str, Any]:
        id = self.id

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

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "id": id,
                "status": status,
                "plan": plan,
                "current_period_end": current_period_end,
                "cancel_at_period_end": cancel_at_period_end,
                "cancel_at": cancel_at,
                "trial_end": trial_end,
                "ended_at": ended_at,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        id = d.pop("id")

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

        subscription = cls(
            id=id,
            status=status,
            plan=plan,
            current_period_end=current_period_end,
            cancel_at_period_end=cancel_at_period_end,
            cancel_at=cancel_at,
            trial_end=trial_end,
            ended_at=ended_at,
        )

        return subscription
