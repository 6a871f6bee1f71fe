"""The Python client against the running local stack (scripts/e2e, through scripts/clients e2e).

    live:     read an account, check a feature, a debit whose first answer is lost and retried
              under its key (one debit), the usage and the event log paged, the effects the
              dispatcher delivered verified and applied; the guarded checks fill their cache
    degraded: with the api stopped, the guarded checks answer from that cache, stale
"""

import base64
import json
import os
import sys

import httpx

from billing_inbox import (
    BillingInbox,
    BillingInboxError,
    EffectReceiver,
    FileCheckCache,
    GuardedChecks,
    MemoryEffectStore,
    Refusal,
    new_idempotency_key,
    verify,
)

API_URL = os.environ["INBOX_API_URL"]
API_KEY = os.environ["INBOX_DEV_API_KEY"]
CUSTOMER = os.environ.get("INBOX_CLIENTS_CUSTOMER", "kc_e2e")
EFFECTS_CUSTOMER = os.environ.get("INBOX_CLIENTS_EFFECTS_CUSTOMER", "kc_clients")
CACHE = FileCheckCache(os.path.join(os.environ["INBOX_CLIENTS_STATE"], "python-cache.json"))

failed = 0


def check(what, ok, detail=""):
    global failed
    print(f"clients (python): {'ok' if ok else 'FAILED'}: {what}{'' if ok else f' {detail!r}'}", flush=True)
    if not ok:
        failed += 1


api = BillingInbox(API_URL, API_KEY, source="kinde")


class LosesTheFirstAnswer(httpx.HTTPTransport):
    """The first debit's answer is lost after the API recorded it: a 503 comes in its place."""

    lost = 0

    def handle_request(self, request):
        answer = super().handle_request(request)
        if request.method == "POST" and self.lost == 0:
            self.lost += 1
            answer.read()
            return httpx.Response(503, json={"code": "unavailable", "detail": "the answer was lost"},
                                  headers={"retry-after": "0"})
        return answer


def live():
    before = api.account(CUSTOMER)
    check(f"reads {CUSTOMER}: {before.plan}, {before.remaining} left", before.plan == "pro", before)
    sso = api.feature(CUSTOMER, "sso")
    check("checks a feature: sso allowed", sso.allowed is True, sso)

    lossy = LosesTheFirstAnswer()
    key = new_idempotency_key()
    debit = BillingInbox(API_URL, API_KEY, source="kinde", transport=lossy).debit(
        CUSTOMER, 1, idempotency_key=key, note="python client e2e")
    check("a debit retried after a lost answer is answered as replayed", lossy.lost == 1 and debit.replayed, debit)
    after = api.account(CUSTOMER)
    check(f"one debit: used {before.used} → {after.used}", after.used == before.used + 1, after)

    pages = list(api.usage_pages(CUSTOMER, limit=1))
    keys = [u.idempotency_key for page in pages for u in page.usage]
    check(f"the usage paged one at a time ({len(pages)} pages), the key once",
          len(pages) >= 2 and keys.count(key) == 1, keys)
    events = list(api.events(CUSTOMER, limit=1))
    check(f"the event log paged ({len(events)} events)", len(events) >= 1, events)

    receive_effects()

    guarded = GuardedChecks(api, cache=CACHE, timeout=5)
    cached = guarded.feature(CUSTOMER, "sso")
    account = guarded.account(CUSTOMER)
    check("the guarded checks answer fresh while the api is up",
          not cached.stale and cached.allowed and not account.stale, (cached, account))


def receive_effects():
    directory = os.environ["INBOX_CLIENTS_RECORDED"]
    secret = os.environ["INBOX_CLIENTS_SECRET"]
    deliveries = []
    for name in sorted(f for f in os.listdir(directory) if f.endswith(".json")):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            record = json.load(f)
        deliveries.append((base64.b64decode(record["body"]), record["headers"], record["received_at"]))
    # Verified as at its arrival: the signature, the secret, the timestamp then.
    results = [verify(raw, headers, secret, now=at) for raw, headers, at in deliveries]
    check(f"every delivery the dispatcher made verifies ({len(results)})",
          results and all(r.ok for r in results), [r for r in results if not r.ok])
    raw, headers, at = deliveries[0]
    wrong = verify(raw, headers, "whsec_" + base64.b64encode(b"not the secret").decode(), now=at)
    check("another secret is refused", isinstance(wrong, Refusal) and wrong.reason == "bad_signature", wrong)

    mine = [r.effect for r in results if r.ok and r.effect.customer_id == EFFECTS_CUSTOMER]
    ids = [e.id for e in mine]
    copies = [i for n, i in enumerate(ids) if i in ids[:n]]
    check(f"the replayed effect came twice ({len(copies)} copy)", len(copies) >= 1, ids)
    typed = [e for e in mine if e.known and e.typed is None]
    check("every known effect read by its generated model", not typed, typed)

    # Applied newest first: the receiver must drop the older plan and still apply every grant.
    receiver = EffectReceiver(MemoryEffectStore(), lambda e: None)
    outcomes = [(e, receiver.receive(e)) for e in sorted(mine, key=lambda e: -e.sequence)]

    def of(kind, outcome):
        return [e for e, o in outcomes if e.type == kind and o == outcome]

    plans = of("billing.plan_changed", "applied")
    check("the newest plan applied, team", len(plans) == 1 and plans[0].data["plan"] == "team", outcomes)
    check("the older plan dropped", len(of("billing.plan_changed", "older")) >= 1, outcomes)
    check("both grants applied, whatever their order", len(of("billing.allowance_granted", "applied")) == 2, outcomes)
    check("the replayed copy applied once", sum(o == "duplicate" for _, o in outcomes) == len(copies), outcomes)


def degraded():
    guarded = GuardedChecks(api, cache=CACHE, timeout=2)
    sso = guarded.feature(CUSTOMER, "sso")
    check(f"with the api stopped, sso from the cache (stale, as of {sso.as_of})",
          sso.allowed and sso.stale and sso.as_of is not None, sso)
    unseen = guarded.feature(CUSTOMER, "audit-log")
    check("a feature never seen is refused (fail closed)",
          not unseen.allowed and unseen.stale and unseen.as_of is None, unseen)
    account = guarded.account(CUSTOMER)
    check("the account from the cache, stale", account.stale and account.account.plan == "pro", account)
    try:
        api.account(CUSTOMER)
        check("an unguarded read is one typed error", False, "it answered")
    except BillingInboxError as e:
        check("an unguarded read is one typed error", e.status == 0, e)


if __name__ == "__main__":
    phase = sys.argv[1] if len(sys.argv) > 1 else ""
    try:
        {"live": live, "degraded": degraded}[phase]()
    except BillingInboxError as e:
        check(f"{e.status} {e.code}: {e.detail}", False)
    sys.exit(0 if failed == 0 else 1)
