from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.account_events import AccountEvents
from ...models.bad_request_error import BadRequestError
from ...models.error import Error
from ...types import UNSET, Response, Unset


def _get_kwargs(
    source: str,
    customer: str,
    *,
    limit: int | Unset = 50,
    after: str | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    params["limit"] = limit

    params["after"] = after

    params["stripe_account"] = stripe_account

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/accounts/{source}/{customer}/events".format(
            source=quote(str(source), safe=""),
            customer=quote(str(customer), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> AccountEvents | BadRequestError | Error | None:
    if response.status_code == 200:
        response_200 = AccountEvents.from_dict(response.json())

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
) -> Response[AccountEvents | BadRequestError | Error]:
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
    limit: int | Unset = 50,
    after: str | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> Response[AccountEvents | BadRequestError | Error]:
    """The account's billing events in provider order, each with its outcome and reason, a page at a time

     What inboxctl account prints as the event log: every event the account's log names, whichever row
    names the account (a Stripe thin event, a links-only invoice_payment.paid, the refund of a customer
    that is an Account), and its events not finished yet or given up (dead, unprocessable). An event the
    purge took is still listed (status purged) from the account's log.

    Args:
        source (str):
        customer (str):
        limit (int | Unset):  Default: 50.
        after (str | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[AccountEvents | BadRequestError | Error]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        limit=limit,
        after=after,
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
    limit: int | Unset = 50,
    after: str | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> AccountEvents | BadRequestError | Error | None:
    """The account's billing events in provider order, each with its outcome and reason, a page at a time

     What inboxctl account prints as the event log: every event the account's log names, whichever row
    names the account (a Stripe thin event, a links-only invoice_payment.paid, the refund of a customer
    that is an Account), and its events not finished yet or given up (dead, unprocessable). An event the
    purge took is still listed (status purged) from the account's log.

    Args:
        source (str):
        customer (str):
        limit (int | Unset):  Default: 50.
        after (str | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        AccountEvents | BadRequestError | Error
    """

    return sync_detailed(
        source=source,
        customer=customer,
        client=client,
        limit=limit,
        after=after,
        stripe_account=stripe_account,
    ).parsed


async def asyncio_detailed(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    limit: int | Unset = 50,
    after: str | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> Response[AccountEvents | BadRequestError | Error]:
    """The account's billing events in provider order, each with its outcome and reason, a page at a time

     What inboxctl account prints as the event log: every event the account's log names, whichever row
    names the account (a Stripe thin event, a links-only invoice_payment.paid, the refund of a customer
    that is an Account), and its events not finished yet or given up (dead, unprocessable). An event the
    purge took is still listed (status purged) from the account's log.

    Args:
        source (str):
        customer (str):
        limit (int | Unset):  Default: 50.
        after (str | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[AccountEvents | BadRequestError | Error]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        limit=limit,
        after=after,
        stripe_account=stripe_account,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    source: str,
    customer: str,
    *,
    client: AuthenticatedClient | Client,
    limit: int | Unset = 50,
    after: str | Unset = UNSET,
    stripe_account: str | Unset = UNSET,
) -> AccountEvents | BadRequestError | Error | None:
    """The account's billing events in provider order, each with its outcome and reason, a page at a time

     What inboxctl account prints as the event log: every event the account's log names, whichever row
    names the account (a Stripe thin event, a links-only invoice_payment.paid, the refund of a customer
    that is an Account), and its events not finished yet or given up (dead, unprocessable). An event the
    purge took is still listed (status purged) from the account's log.

    Args:
        source (str):
        customer (str):
        limit (int | Unset):  Default: 50.
        after (str | Unset):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        AccountEvents | BadRequestError | Error
    """

    return (
        await asyncio_detailed(
            source=source,
            customer=customer,
            client=client,
            limit=limit,
            after=after,
            stripe_account=stripe_account,
        )
    ).parsed
