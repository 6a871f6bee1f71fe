from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ... import errors
from ...client import AuthenticatedClient, Client
from ...models.bad_request_error import BadRequestError
from ...models.error import Error
from ...models.reversal import Reversal
from ...types import UNSET, Response, Unset


def _get_kwargs(
    source: str,
    customer: str,
    usage_id: str,
    *,
    stripe_account: str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    params["stripe_account"] = stripe_account

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/accounts/{source}/{customer}/usage/{usage_id}/reversal".format(
            source=quote(str(source), safe=""),
            customer=quote(str(customer), safe=""),
            usage_id=quote(str(usage_id), safe=""),
        ),
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> BadRequestError | Error | Reversal | None:
    if response.status_code == 200:
        response_200 = Reversal.from_dict(response.json())

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
        response_409 = Error.from_dict(response.json())

        return response_409

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
) -> Response[BadRequestError | Error | Reversal]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    source: str,
    customer: str,
    usage_id: str,
    *,
    client: AuthenticatedClient | Client,
    stripe_account: str | Unset = UNSET,
) -> Response[BadRequestError | Error | Reversal]:
    """Take an accepted debit back, once

     The debit's amount returns to its period's allowance, and its meter report (a source with a meter)
    is withdrawn if it never reached the provider, or corrected there (docs/design.md §4.13). The
    reversal is stored with its answer: asked again, the same answer, replayed. Needs the usage scope;
    no body, no Idempotency-Key (the debit names it).

    Args:
        source (str):
        customer (str):
        usage_id (str):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BadRequestError | Error | Reversal]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        usage_id=usage_id,
        stripe_account=stripe_account,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    source: str,
    customer: str,
    usage_id: str,
    *,
    client: AuthenticatedClient | Client,
    stripe_account: str | Unset = UNSET,
) -> BadRequestError | Error | Reversal | None:
    """Take an accepted debit back, once

     The debit's amount returns to its period's allowance, and its meter report (a source with a meter)
    is withdrawn if it never reached the provider, or corrected there (docs/design.md §4.13). The
    reversal is stored with its answer: asked again, the same answer, replayed. Needs the usage scope;
    no body, no Idempotency-Key (the debit names it).

    Args:
        source (str):
        customer (str):
        usage_id (str):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BadRequestError | Error | Reversal
    """

    return sync_detailed(
        source=source,
        customer=customer,
        usage_id=usage_id,
        client=client,
        stripe_account=stripe_account,
    ).parsed


async def asyncio_detailed(
    source: str,
    customer: str,
    usage_id: str,
    *,
    client: AuthenticatedClient | Client,
    stripe_account: str | Unset = UNSET,
) -> Response[BadRequestError | Error | Reversal]:
    """Take an accepted debit back, once

     The debit's amount returns to its period's allowance, and its meter report (a source with a meter)
    is withdrawn if it never reached the provider, or corrected there (docs/design.md §4.13). The
    reversal is stored with its answer: asked again, the same answer, replayed. Needs the usage scope;
    no body, no Idempotency-Key (the debit names it).

    Args:
        source (str):
        customer (str):
        usage_id (str):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BadRequestError | Error | Reversal]
    """

    kwargs = _get_kwargs(
        source=source,
        customer=customer,
        usage_id=usage_id,
        stripe_account=stripe_account,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    source: str,
    customer: str,
    usage_id: str,
    *,
    client: AuthenticatedClient | Client,
    stripe_account: str | Unset = UNSET,
) -> BadRequestError | Error | Reversal | None:
    """Take an accepted debit back, once

     The debit's amount returns to its period's allowance, and its meter report (a source with a meter)
    is withdrawn if it never reached the provider, or corrected there (docs/design.md §4.13). The
    reversal is stored with its answer: asked again, the same answer, replayed. Needs the usage scope;
    no body, no Idempotency-Key (the debit names it).

    Args:
        source (str):
        customer (str):
        usage_id (str):
        stripe_account (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BadRequestError | Error | Reversal
    """

    return (
        await asyncio_detailed(
            source=source,
            customer=customer,
            usage_id=usage_id,
            client=client,
            stripe_account=stripe_account,
        )
    ).parsed
