#!/usr/bin/env python3
"""Cuts a provider's published OpenAPI description down to the routes billing-inbox calls.

    trim-openapi.py PROVIDER UPSTREAM_FILE > testdata/openapi/PROVIDER.json

The tests check every request a provider fake receives against the file this writes
(fakes/src/described.rs, docs/design.md §6.6). A published description is megabytes
(Stripe's is over 7 MB); the project keeps, for each route below, the request side of the
operation only: its `parameters` and `requestBody`, with the `components` they reference,
and none of the prose (`description`, `summary`, `example`, `examples`) or `responses`. The
result names what it was cut from (`x-trimmed-from`), so the same command on the same
upstream file gives the same bytes.

Where a provider documents a change its published file does not carry yet, the change is
added here, as a patch beside the page that announces it (PATCHES), never by editing the
output by hand.

The upstream files (each at the version UPSTREAM names):
- stripe: github.com/stripe/openapi `latest/openapi.spec3.json`
- paddle: github.com/PaddleHQ/paddle-openapi `v1/openapi.yaml`
- polar: github.com/polarsource/polar `docs/openapi/2026-10.openapi.json`
- kinde: github.com/kinde-oss/kinde-dotnet-sdk `api/openapi.yaml` (Kinde's Management API
  specification, as Kinde's .NET SDK is generated from it)
"""

import copy
import json
import sys

import yaml

# Where each description comes from: repository, path in it, commit, and the API version
# the file describes.
UPSTREAM = {
    "stripe": {
        "repository": "stripe/openapi",
        "path": "latest/openapi.spec3.json",
        "commit": "18fa2cc768024b47789dc6fa243acd48478acac2",
        "version": "2026-09-30.endive",
        # The file is over 4 MiB and was not in the snapshot at hand: the routes were cut from
        # an excerpt of its operations as a public-code index holds them. This command on the
        # full file should give the same bytes; until that is run, the note stays.
        "cut-from": "an excerpt of the file's operations for these routes, not the whole file",
        # The object reads of a thin event, a refund and a health notice (GetCustomersCustomer,
        # GetPaymentIntentsIntent, GetChargesCharge, GetV2CoreEventsId) were cut later, from
        # the same file's operations at a2de9917ac9c7be3ba11abd5151b5c2df3add59e.
        # The credits audit's two reads (GetBillingCreditBalanceSummary, GetBillingCreditGrants)
        # were cut after those, from the same file's operations at the same commit, and the
        # read of one grant a thin grant event makes (GetBillingCreditGrantsId) after them.
        "cut-from-later": "GetCustomersCustomer, GetPaymentIntentsIntent, GetChargesCharge and "
        "GetV2CoreEventsId, then GetBillingCreditBalanceSummary and GetBillingCreditGrants, then "
        "GetBillingCreditGrantsId, from latest/openapi.spec3.json at "
        "a2de9917ac9c7be3ba11abd5151b5c2df3add59e",
    },
    "paddle": {
        "repository": "PaddleHQ/paddle-openapi",
        "path": "v1/openapi.yaml",
        "commit": "792a49e66b1c6cecdb5a9d54a04b2c7186cb44e9",
        "version": "1.0 (2025-05-27)",
    },
    "polar": {
        "repository": "polarsource/polar",
        "path": "docs/openapi/2026-10.openapi.json",
        "commit": "790b7ebcd6dfaa5469217eee498b9e21d38c8b8f",
        "version": "2026-10",
    },
    "kinde": {
        "repository": "kinde-oss/kinde-dotnet-sdk",
        "path": "api/openapi.yaml",
        "commit": "929ced820c69d555cf6851c26fc075b0b4fdf462",
        "version": "Kinde Management API 1 (2026-06-01)",
    },
}

# The routes the project calls, per provider: path template -> methods.
ROUTES = {
    "stripe": {
        # Meter reports and their corrections (shared/src/providers/stripe/meter.rs).
        "/v1/billing/meter_events": ["post"],
        "/v1/billing/meter_event_adjustments": ["post"],
        # The meter by its event name, and its totals (the read-back and the meter audit).
        "/v1/billing/meters": ["get"],
        "/v1/billing/meters/{id}/event_summaries": ["get"],
        # For the credits audit against Stripe (a customer's balance as Stripe sums it, every
        # grant listed; docs/design.md §4.14, not built yet: §9).
        "/v1/billing/credit_balance_summary": ["get"],
        "/v1/billing/credit_grants": ["get"],
        # A thin credit grant event's grant, read whole (providers/stripe/thin.rs).
        "/v1/billing/credit_grants/{id}": ["get"],
        # Reconciliation's walk (providers/stripe/api.rs) and an entitlement summary's
        # snapshot event (providers/stripe/entitlements.rs).
        "/v1/events": ["get"],
        "/v1/events/{id}": ["get"],
        # A customer's active entitlements, read whole.
        "/v1/entitlements/active_entitlements": ["get"],
        # The subscription read at a tie or a payment, and the thin events' walk of every
        # subscription (providers/stripe/thin.rs).
        "/v1/subscriptions": ["get"],
        "/v1/subscriptions/{subscription_exposed_id}": ["get"],
        # A refund's invoice, through its payment intent's invoice payment; a thin event's
        # related invoice payment.
        "/v1/invoice_payments": ["get"],
        "/v1/invoice_payments/{invoice_payment}": ["get"],
        # A thin event's related invoice (providers/stripe/thin.rs).
        "/v1/invoices/{invoice}": ["get"],
        # A thin event's related customer, and a refund's charge and payment intent
        # (providers/stripe/thin.rs, api.rs).
        "/v1/customers/{customer}": ["get"],
        "/v1/payment_intents/{intent}": ["get"],
        "/v1/charges/{charge}": ["get"],
        # A health notice's v2 event, read whole (providers/stripe/thin.rs `fetch_v2_event`).
        "/v2/core/events/{id}": ["get"],
    },
    "paddle": {
        # Reconciliation's walk and what Paddle failed to deliver (providers/paddle/api.rs).
        "/events": ["get"],
        "/notifications": ["get"],
        # The subscription read at a transaction.
        "/subscriptions/{subscription_id}": ["get"],
    },
    "polar": {
        # The subscription sweep and the subscription read (providers/standard_webhooks/api.rs).
        "/v1/subscriptions/": ["get"],
        "/v1/subscriptions/{id}": ["get"],
        # Meter reports, the meter by its filter, and its quantities (.../meter.rs).
        "/v1/events/ingest": ["post"],
        "/v1/meters/": ["get"],
        "/v1/meters/{id}/quantities": ["get"],
    },
    "kinde": {
        # The M2M token the Management API is called with (providers/kinde/api.rs).
        "/oauth2/token": ["post"],
        # A customer's plans and entitlements, and meter reports to the customer's agreement
        # (providers/kinde/api.rs, meter.rs).
        "/api/v1/billing/entitlements": ["get"],
        "/api/v1/billing/agreements": ["get"],
        "/api/v1/billing/meter_usage": ["post"],
    },
}


def paddle_event_type(doc):
    """`GET /events?event_type=`: "We added a new event_type query parameter that you can use
    when working with the list events operation … Use a comma-separated list to specify
    multiple event types" (developer.paddle.com/changelog/2025/filter-events-by-type, released
    July 25, 2025, after the pinned file)."""
    parameters = doc["paths"]["/events"]["get"].setdefault("parameters", [])
    if not any(p.get("name") == "event_type" for p in parameters):
        parameters.append(
            {
                "name": "event_type",
                "in": "query",
                "required": False,
                "style": "form",
                "explode": False,
                "schema": {"type": "array", "items": {"type": "string"}},
            }
        )


def operations(provider, doc):
    """The kept operations of `doc`."""
    for template, methods in ROUTES[provider].items():
        for method in methods:
            yield doc["paths"][template][method]


def stripe_list_limits(doc):
    """Every list's `limit`: "Limit can range between 1 and 100, and the default is 10" (the
    parameter's own description; its schema says only `integer`)."""
    for operation in operations("stripe", doc):
        for parameter in operation.get("parameters", []):
            if parameter["name"] == "limit" and "between 1 and 100" in parameter.get(
                "description", ""
            ):
                parameter["schema"].update({"minimum": 1, "maximum": 100})


def stripe_event_types(doc):
    """`GET /v1/events?types[]=`: "An array of up to 20 strings containing specific event
    names" (the parameter's own description; its schema sets no `maxItems`)."""
    for parameter in doc["paths"]["/v1/events"]["get"]["parameters"]:
        if parameter["name"] == "types" and "up to 20 strings" in parameter.get("description", ""):
            parameter["schema"]["maxItems"] = 20


def kinde_token(doc):
    """`POST /oauth2/token`, which the Management API's description leaves out (it is Kinde's
    OAuth endpoint): "perform a POST request to the https://<your_subdomain>.kinde.com/oauth2/token
    endpoint … content-type: application/x-www-form-urlencoded … grant_type=client_credentials
    … client_id … client_secret … audience=https://<your_subdomain>.kinde.com/api"
    (docs.kinde.com/developer-tools/kinde-api/access-token-for-api); "If your app has scopes
    assigned, you can optionally request them: &scope=…"
    (docs.kinde.com/machine-to-machine-applications/about-m2m/authenticate-with-m2m)."""
    text = {"type": "string"}
    doc["paths"]["/oauth2/token"] = {
        "post": {
            "operationId": "requestM2MToken",
            "requestBody": {
                "required": True,
                "content": {
                    "application/x-www-form-urlencoded": {
                        "schema": {
                            "type": "object",
                            "required": ["grant_type", "client_id", "client_secret", "audience"],
                            "properties": {
                                "grant_type": {"type": "string", "enum": ["client_credentials"]},
                                "client_id": text,
                                "client_secret": text,
                                "audience": text,
                                "scope": text,
                            },
                            "additionalProperties": False,
                        }
                    }
                },
            },
        }
    }


PATCHES = {
    "stripe": [stripe_list_limits, stripe_event_types],
    "paddle": [paddle_event_type],
    "kinde": [kinde_token],
}

PROSE = {"description", "summary", "example", "examples"}


def without_prose(node, under_properties=False):
    """`node` without the prose keywords; a schema's `properties` keep every name, a
    property called `description` included."""
    if isinstance(node, dict):
        return {
            k: without_prose(v, k == "properties" and not under_properties)
            for k, v in node.items()
            if under_properties or k not in PROSE
        }
    if isinstance(node, list):
        return [without_prose(v) for v in node]
    return node


def refs(node):
    """Every local `$ref` under `node`."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str) and v.startswith("#/"):
                yield v
            else:
                yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)


def pointer(doc, ref):
    node = doc
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def trim(provider, doc):
    doc = copy.deepcopy(doc)
    for patch in PATCHES.get(provider, []):
        patch(doc)
    paths = {}
    for template, methods in ROUTES[provider].items():
        item = doc["paths"][template]
        kept = {}
        if "parameters" in item:
            kept["parameters"] = item["parameters"]
        for method in methods:
            operation = item[method]
            kept[method] = {
                k: operation[k]
                for k in ("operationId", "parameters", "requestBody")
                if k in operation
            }
        paths[template] = without_prose(kept)
    # The components the kept operations reference, and the ones those reference.
    components = {}
    pending = list(refs(paths))
    while pending:
        ref = pending.pop()
        section, name = ref.split("/")[2], "/".join(ref.split("/")[3:])
        if name in components.get(section, {}):
            continue
        target = without_prose(pointer(doc, ref))
        components.setdefault(section, {})[name] = target
        pending.extend(refs(target))
    trimmed = {
        "openapi": doc["openapi"],
        "info": {"title": doc["info"]["title"], "version": doc["info"]["version"]},
        "x-trimmed-from": UPSTREAM[provider],
        "paths": paths,
    }
    if components:
        trimmed["components"] = {s: dict(sorted(c.items())) for s, c in sorted(components.items())}
    return trimmed


def main():
    provider, upstream = sys.argv[1], sys.argv[2]
    with open(upstream, encoding="utf-8") as f:
        doc = json.load(f) if upstream.endswith(".json") else yaml.safe_load(f)
    json.dump(trim(provider, doc), sys.stdout, indent=2, sort_keys=False, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
