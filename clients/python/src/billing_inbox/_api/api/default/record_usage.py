from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.bad_request_error import BadRequestError
from ...models.debit import Debit
from ...models.debit_request import DebitRequest
from ...models.error import Error
from ...models.exhausted import Exhausted
from ...types import UNSET, Response, Unset


def _get_kwargs(
    source: str,
    customer: str,
    *,
    body: DebitRequest,
    stripe_account: str | Unset = UNSET,
    idempotency_key: str,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    headers["Idempotency-Key"] = idempotency_key

    params: dict[str, Any] = {}

    params["stripe_account"] = stripe_account

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/accounts/{source}/{customer}/usage".format(
            source=quote(str(source), safe=""),
            customer=quote(str(customer), safe=""),
        ),
        "params": params,
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> BadRequestError | Debit | Error | Exhausted | None:
    if response.status_code == 200:
        response_200 = Debit.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = BadRequestError.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Error.from_dict(response.json())

        return response_401

    if response.status_code == 403:
        response_403 = Error.from_dict(response.json())

        return response_403

    if response.status_code == 404:
        response_404 = Error.from_dict(response.json())

        return response_404

    if response.status_code == 409:

        def _parse_response_409(data: object) -> Error | Exhausted:
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                response_409_type_0 = Exhausted.from_dict(data)

                return response_409_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            response_409_type_1 = Error.from_dict(data)

            return response_409_type_1

        response_409 = _parse_response_409(response.json())

        return response_409

    if response.status_code == 413:
        response_413 = Error.from_dict(response.json())

        return response_413

    if response.status_code == 422:
        response_422 = Error.from_dict(response.json())

        return response_422

    if response.status_code == 503:
        response_503 = Error.from_dict(response.json())

        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[BadRequestError | Debit | Error | Exhausted]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    body: DebitRequest,
    stripe_account: str | Unset = UNSET,
    idempotency_key: str,
) -> Response[BadRequestError | Debit | Error | Exhausted]:
    """Spend the period's allowance, then credit grants, once per Idempotency-Key

     A debit of the allowance's unit (`credits`, the default) spends what the period's allowance has
    left, then the account's credit grants of that unit in the burn order (version 1: priority
    ascending, expires_at ascending with none last, promotional before paid, effective_at, grant id),
    each as far as it is available at the debit's time; a debit of another unit spends grants of that
    unit only. All or nothing.

    Args:
        source (str):
        customer (str):
        stripe_account (str | Unset):
        idempotency_key (str):
        body (DebitRequest): A JSON object (an array is 400 body_not_object); a field is given or
            left out, never null (400 null_field).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BadRequestError | Debit | Error | Error | Exhausted]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        body=body,
        stripe_account=stripe_account,
        idempotency_key=idempotency_key,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    body: DebitRequest,
    stripe_account: str | Unset = UNSET,
    idempotency_key: str,
) -> BadRequestError | Debit | Error | Exhausted | None:
    """Spend the period's allowance, then credit grants, once per Idempotency-Key

     A debit of the allowance's unit (`credits`, the default) spends what the period's allowance has
    left, then the account's credit grants of that unit in the burn order (version 1: priority
    ascending, expires_at ascending with none last, promotional before paid, effective_at, grant id),
    each as far as it is available at the debit's time; a debit of another unit spends grants of that
    unit only. All or nothing.

    Args:
        source (str):
        customer (str):
        stripe_account (str | Unset):
        idempotency_key (str):
        body (DebitRequest): A JSON object (an array is 400 body_not_object); a field is given or
            left out, never null (400 null_field).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BadRequestError | Debit | Error | Error | Exhausted
    """

    return sync_detailed(
        source=source,
        customer=customer,
        client=client,
        body=body,
        stripe_account=stripe_account,
        idempotency_key=idempotency_key,
    ).parsed


async def asyncio_detailed(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    body: DebitRequest,
    stripe_account: str | Unset = UNSET,
    idempotency_key: str,
) -> Response[BadRequestError | Debit | Error | Exhausted]:
    """Spend the period's allowance, then credit grants, once per Idempotency-Key

     A debit of the allowance's unit (`credits`, the default) spends what the period's allowance has
    left, then the account's credit grants of that unit in the burn order (version 1: priority
    ascending, expires_at ascending with none last, promotional before paid, effective_at, grant id),
    each as far as it is available at the debit's time; a debit of another unit spends grants of that
    unit only. All or nothing.

    Args:
        source (str):
        customer (str):
        stripe_account (str | Unset):
        idempotency_key (str):
        body (DebitRequest): A JSON object (an array is 400 body_not_object); a field is given or
            left out, never null (400 null_field).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BadRequestError | Debit | Error | Error | Exhausted]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        body=body,
        stripe_account=stripe_account,
        idempotency_key=idempotency_key,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    body: DebitRequest,
    stripe_account: str | Unset = UNSET,
    idempotency_key: str,
) -> BadRequestError | Debit | Error | Exhausted | None:
    """Spend the period's allowance, then credit grants, once per Idempotency-Key

     A debit of the allowance's unit (`credits`, the default) spends what the period's allowance has
    left, then the account's credit grants of that unit in the burn order (version 1: priority
    ascending, expires_at ascending with none last, promotional before paid, effective_at, grant id),
    each as far as it is available at the debit's time; a debit of another unit spends grants of that
    unit only. All or nothing.

    Args:
        source (str):
        customer (str):
        stripe_account (str | Unset):
        idempotency_key (str):
        body (DebitRequest): A JSON object (an array is 400 body_not_object); a field is given or
            left out, never null (400 null_field).

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BadRequestError | Debit | Error | Error | Exhausted
    """

    return (
        await asyncio_detailed(
            source=source,
            customer=customer,
            client=client,
            body=body,
            stripe_account=stripe_account,
            idempotency_key=idempotency_key,
        )
    ).parsed
