import datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.bad_request_error import BadRequestError
from ...models.credits_ import Credits
from ...models.error import Error
from ...types import UNSET, Response, Unset


def _get_kwargs(
    source: str,
    customer: str,
    *,
    at: datetime.datetime | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    json_at: str | Unset = UNSET
    if not isinstance(at, Unset):
        json_at = at.isoformat()
    params["at"] = json_at

    params["stripe_account"] = stripe_account

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/accounts/{source}/{customer}/credits".format(
            source=quote(str(source), safe=""),
            customer=quote(str(customer), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> BadRequestError | Credits | Error | None:
    if response.status_code == 200:
        response_200 = Credits.from_dict(response.json())

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

    if response.status_code == 503:
        response_503 = Error.from_dict(response.json())

        return response_503

    if client.raise_on_unexpected_status:
        raise errors.UnexpectedStatus(response.status_code, response.content)
    else:
        return None


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[BadRequestError | Credits | Error]:
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
    stripe_account: str | Unset = UNSET,
) -> Response[BadRequestError | Credits | Error]:
    """The account's prepaid credit, per unit and scope, and each grant, as of a time

     The fold of the account's grant registers and their ledgers (docs/design.md §4.14), read in one
    statement: Stripe Billing Credits grants, the catalog's credit packs and Polar meter credits, each
    with what remains of it. Amounts are decimal strings (a Stripe monetary grant's unit is its
    currency, in minor units); a balance is never shown below zero.

    Args:
        source (str):
        customer (str):
        at (datetime.datetime | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BadRequestError | Credits | Error]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        at=at,
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
    stripe_account: str | Unset = UNSET,
) -> BadRequestError | Credits | Error | None:
    """The account's prepaid credit, per unit and scope, and each grant, as of a time

     The fold of the account's grant registers and their ledgers (docs/design.md §4.14), read in one
    statement: Stripe Billing Credits grants, the catalog's credit packs and Polar meter credits, each
    with what remains of it. Amounts are decimal strings (a Stripe monetary grant's unit is its
    currency, in minor units); a balance is never shown below zero.

    Args:
        source (str):
        customer (str):
        at (datetime.datetime | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BadRequestError | Credits | Error
    """

    return sync_detailed(
        source=source,
        customer=customer,
        client=client,
        at=at,
        stripe_account=stripe_account,
    ).parsed


async def asyncio_detailed(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    at: datetime.datetime | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> Response[BadRequestError | Credits | Error]:
    """The account's prepaid credit, per unit and scope, and each grant, as of a time

     The fold of the account's grant registers and their ledgers (docs/design.md §4.14), read in one
    statement: Stripe Billing Credits grants, the catalog's credit packs and Polar meter credits, each
    with what remains of it. Amounts are decimal strings (a Stripe monetary grant's unit is its
    currency, in minor units); a balance is never shown below zero.

    Args:
        source (str):
        customer (str):
        at (datetime.datetime | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BadRequestError | Credits | Error]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        at=at,
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
    stripe_account: str | Unset = UNSET,
) -> BadRequestError | Credits | Error | None:
    """The account's prepaid credit, per unit and scope, and each grant, as of a time

     The fold of the account's grant registers and their ledgers (docs/design.md §4.14), read in one
    statement: Stripe Billing Credits grants, the catalog's credit packs and Polar meter credits, each
    with what remains of it. Amounts are decimal strings (a Stripe monetary grant's unit is its
    currency, in minor units); a balance is never shown below zero.

    Args:
        source (str):
        customer (str):
        at (datetime.datetime | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BadRequestError | Credits | Error
    """

    return (
        await asyncio_detailed(
            source=source,
            customer=customer,
            client=client,
            at=at,
            stripe_account=stripe_account,
        )
    ).parsed
