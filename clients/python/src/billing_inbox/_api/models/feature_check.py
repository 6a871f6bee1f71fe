from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Self, TypeVar, cast

from attrs import define as _attrs_define

if TYPE_CHECKING:
    from ..models.feature_decider import FeatureDecider


T = TypeVar("T", bound="FeatureCheck")


@_attrs_define
class FeatureCheck:
    """
    Attributes:
        key (str): The key asked for
        allowed (bool): The customer has the feature with a value other than false
        value (bool | int | None | str): Its value; null when the customer lacks it
        source (None | str): Where the value comes from: the catalog (the plan's features) or the provider (an active
            entitlement); null when the customer lacks it Known values: catalog, provider (a client accepts others too).
        decided_by (FeatureDecider | None): The event behind the value: the one that gave the plan (catalog) or the one
            its entitlement register holds (provider); null when the customer lacks the feature, or holds it from the free
            plan with no event behind it.
    """

    key: str
    allowed: bool
    value: bool | int | None | str
    source: None | str
    decided_by: FeatureDecider | None

    def to_dict(self) -> dict[str, Any]:
        from ..models.feature_decider import FeatureDecider

        key = self.key

        allowed = self.allowed

        value: bool | int | None | str
        value = self.value

        source: None | str
        source = self.source

        decided_by: dict[str, Any] | None
        if isinstance(self.decided_by, FeatureDecider):
            decided_by = self.decided_by.to_dict()
        else:
            decided_by = self.decided_by

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "key": key,
                "allowed": allowed,
                "value": value,
                "source": source,
                "decided_by": decided_by,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        from ..models.feature_decider import FeatureDecider

        d = dict(src_dict)
        key = d.pop("key")

        allowed = d.pop("allowed")

        def _parse_value(data: object) -> bool | int | None | str:
            if data is None:
                return data
            return cast(bool | int | None | str, data)

        value = _parse_value(d.pop("value"))

        def _parse_source(data: object) -> None | str:
            if data is None:
                return data
            return cast(None | str, data)

        source = _parse_source(d.pop("source"))

        def _parse_decided_by(data: object) -> FeatureDecider | None:
            if data is None:
                return data
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                decided_by_type_0 = FeatureDecider.from_dict(data)

                return decided_by_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            return cast(FeatureDecider | None, data)

        decided_by = _parse_decided_by(d.pop("decided_by"))

        feature_check = cls(
            key=key,
            allowed=allowed,
            value=value,
            source=source,
            decided_by=decided_by,
        )

        return feature_check
