from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self, TypeVar

from attrs import define as _attrs_define

T = TypeVar("T", bound="BadRequestError")


@_attrs_define
class BadRequestError:
    """
    Attributes:
        code (str): Known values: missing_idempotency_key, bad_idempotency_key, bad_body, body_not_object, null_field,
            bad_amount, bad_note, bad_unit, bad_period, future_period, bad_time, bad_limit, bad_cursor, bad_usage_id,
            bad_customer, bad_stripe_account, bad_path, bad_feature_key, bad_event_id, bad_status, bad_step,
            unknown_scenario, unknown_parameter, repeated_parameter, bad_parameter (a client accepts others too).
        detail (str):
    """

    code: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        code = self.code

        detail = self.detail

        field_dict: dict[str, Any] = {}

        field_dict.update(
            {
                "code": code,
                "detail": detail,
            }
        )

        return field_dict

    @classmethod
    def from_dict(cls, src_dict: Mapping[str, Any]) -> Self:
        d = dict(src_dict)
        code = d.pop("code")

        detail = d.pop("detail")

        bad_request_error = cls(
            code=code,
            detail=detail,
        )

        return bad_request_error
