#!/usr/bin/env python3
"""Asks Paddle's own SDK whether a delivery is signed (docs/design.md §6.4).

    paddle-verify.py --header 'ts=…;h1=…[;h1=…]' --secret S [--secret S2 …] < body

Runs paddle-python-sdk's `paddle_billing.Notifications.Verifier` as a Paddle integration
would: a request object with the raw body and its headers, the destination's secrets as
`Secret`s (a list, the SDK's rotation form), the SDK's own time check (5 s either side of
this machine's clock). Prints `valid` (exit 0) or `invalid` (exit 1), or `stale` (exit 3)
when the SDK refused a header whose `ts` was outside its 5 s by then (a caller that signed just
before may sign again: a loaded machine can take that long to start this); anything the SDK
raises other than its refusal is an error (exit 2). Run it with the python of the tool set
`paddle-sdk` (scripts/tools/paddle-sdk.txt): `$(bash scripts/tools.sh bin paddle-sdk)/python`.
"""

import argparse
import logging
import os
import sys
from time import time

from paddle_billing.Notifications import PaddleSignature, Secret, Verifier


class Headers:
    """Header names are case-insensitive, as a web framework's headers are."""

    def __init__(self, headers: dict[str, str]):
        self._headers = {k.lower(): v for k, v in headers.items()}

    def get(self, key: str, default=None):
        return self._headers.get(key.lower(), default)


class Request:
    """The SDK's `Notifications.Requests.Request` protocol: a raw `body` and `headers`."""

    def __init__(self, body: bytes, headers: dict[str, str]):
        self.body = body
        self.headers = Headers(headers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--header", required=True, help="the Paddle-Signature header value")
    parser.add_argument("--secret", action="append", required=True, help="a destination secret")
    args = parser.parse_args()
    # TEST_MODE=1 would turn the SDK's time check off: this check keeps it on.
    os.environ.pop("TEST_MODE", None)
    logging.disable(logging.CRITICAL)
    request = Request(sys.stdin.buffer.read(), {"Paddle-Signature": args.header})
    secrets = [Secret(s) for s in args.secret]
    verifier = Verifier()
    try:
        verdict = verifier.verify(request, secrets)
    except ConnectionRefusedError:
        # The SDK raises this when no secret of a list verifies.
        verdict = False
    except Exception as e:  # noqa: BLE001 - any other failure is not a verdict
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if not verdict:
        # The SDK's own time check (Verifier.verify), read again to say why it refused.
        ts, _ = PaddleSignature.parse(args.header)
        if abs(time() - ts) > verifier.maximum_variance:
            print("stale")
            return 3
    print("valid" if verdict else "invalid")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
