import datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.bad_request_error import BadRequestError
from ...models.error import Error
from ...models.why import Why
from ...types import UNSET, Response, Unset


def _get_kwargs(
    source: str,
    customer: str,
    *,
    at: datetime.datetime | Unset = UNSET,
    received_before: datetime.datetime | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    json_at: str | Unset = UNSET
    if not isinstance(at, Unset):
        json_at = at.isoformat()
    params["at"] = json_at

    json_received_before: str | Unset = UNSET
    if not isinstance(received_before, Unset):
        json_received_before = received_before.isoformat()
    params["received_before"] = json_received_before

    params["stripe_account"] = stripe_account

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/accounts/{source}/{customer}/why".format(
            source=quote(str(source), safe=""),
            customer=quote(str(customer), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> BadRequestError | Error | Why | None:
    if response.status_code == 200:
        response_200 = Why.from_dict(response.json())

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
) -> Response[BadRequestError | Error | Why]:
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
    at: datetime.datetime | Unset = UNSET,
    received_before: datetime.datetime | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> Response[BadRequestError | Error | Why]:
    """Each field of the account as its kept events give it, with the event that decided it and those it
    beat

    Args:
        source (str):
        customer (str):
        at (datetime.datetime | Unset):
        received_before (datetime.datetime | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BadRequestError | Error | Why]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        at=at,
        received_before=received_before,
        stripe_account=stripe_account,
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
    at: datetime.datetime | Unset = UNSET,
    received_before: datetime.datetime | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> BadRequestError | Error | Why | None:
    """Each field of the account as its kept events give it, with the event that decided it and those it
    beat

    Args:
        source (str):
        customer (str):
        at (datetime.datetime | Unset):
        received_before (datetime.datetime | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BadRequestError | Error | Why
    """

    return sync_detailed(
        source=source,
        customer=customer,
        client=client,
        at=at,
        received_before=received_before,
        stripe_account=stripe_account,
    ).parsed


async def asyncio_detailed(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    at: datetime.datetime | Unset = UNSET,
    received_before: datetime.datetime | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> Response[BadRequestError | Error | Why]:
    """Each field of the account as its kept events give it, with the event that decided it and those it
    beat

    Args:
        source (str):
        customer (str):
        at (datetime.datetime | Unset):
        received_before (datetime.datetime | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BadRequestError | Error | Why]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        at=at,
        received_before=received_before,
        stripe_account=stripe_account,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    at: datetime.datetime | Unset = UNSET,
    received_before: datetime.datetime | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> BadRequestError | Error | Why | None:
    """Each field of the account as its kept events give it, with the event that decided it and those it
    beat

    Args:
        source (str):
        customer (str):
        at (datetime.datetime | Unset):
        received_before (datetime.datetime | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BadRequestError | Error | Why
    """

    return (
        await asyncio_detailed(
            source=source,
            customer=customer,
            client=client,
            at=at,
            received_before=received_before,
            stripe_account=stripe_account,
        )
    ).parsed
