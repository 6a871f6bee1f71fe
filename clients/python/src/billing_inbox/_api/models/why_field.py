from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

from ..types import UNSET, Unset

if TYPE_CHECKING:
    from ..models.beaten import Beaten
    from ..models.event_ref import EventRef


T = TypeVar("T", bound="WhyField")


@_attrs_define
class WhyField:
    """
    Attributes:
        field (str):
        value (Any): The field as the fold gives it (a string, number, boolean or null)
        decided_by (EventRef | None):
        beaten (list[Beaten]):
        stored (Any | Unset): What the register holds, present only when it differs from value
    """

    field: str
    value: Any
    decided_by: EventRef | None
    beaten: list[Beaten]
    stored: Any | Unset = UNSET

    def to_dict(self) -> dict[str, Any]:
        from ..models.event_ref import EventRef

        field = self.field

        value = self.value

        decided_by: dict[str, Any] | None
        if isinstance(self.decided_by, EventRef):
            decided_by = self.decided_by.to_dict()
        else:
            decided_by = self.decided_by

        beaten = []
        for beaten_item_data in self.beaten:
            beaten_item = beaten_item_data.to_dict()
            beaten.append(beaten_item)

        stored = self.stored

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "field": field,
                "value": value,
                "decided_by": decided_by,
                "beaten": beaten,
            }
        )
        if stored is not UNSET:
            field_dict["stored"] = stored

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.beaten import Beaten
        from ..models.event_ref import EventRef

        d = dict(src_dict)
        field = d.pop("field")

        value = d.pop("value")

        def _parse_decided_by(data: object) -> EventRef | None:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                decided_by_type_0 = EventRef.from_dict(data)

                return decided_by_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(EventRef | None, data)

        decided_by = _parse_decided_by(d.pop("decided_by"))

        beaten = []
        _beaten = d.pop("beaten")
        for beaten_item_data in _beaten:
            beaten_item = Beaten.from_dict(beaten_item_data)

            beaten.append(beaten_item)

        stored = d.pop("stored", UNSET)

        why_field = cls(
            field=field,
            value=value,
            decided_by=decided_by,
            beaten=beaten,
            stored=stored,
        )

        return why_field
