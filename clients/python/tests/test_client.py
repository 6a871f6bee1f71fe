import json
from datetime import datetime, timezone

import httpx
import pytest

from billing_inbox import (
    BillingInbox,
    BillingInboxError,
    GuardedChecks,
    MemoryCheckCache,
    RetryPolicy,
    backoff,
    retry_after_seconds,
)

ACCOUNT = {
    "source": "kinde", "customer_id": "kc_1", "plan": "pro", "entitled": True, "deleted": False,
    "period": "2026-12", "allowance": 500, "used": 0, "remaining": 500, "features": {"sso": True},
    "version": 3,
    "subscriptions": [{"id": "sub_1", "status": "paused_by_a_new_rule", "plan": "pro",
                       "current_period_end": None, "cancel_at_period_end": None, "cancel_at": None,
                       "trial_end": None, "ended_at": None}],
}
DEBIT = {"usage_id": "use_1", "amount": 3, "period": "2026-12", "used": 3, "remaining": 497, "replayed": False,
         "unit": "credits", "allocation": {"from_allowance": 3, "from_grants": [], "order_version": 1}}


def scripted(answers):
    """A client whose transport answers from a script and remembers each request; no answer
    left is a connection refused."""
    requests, waits = [], []

    def handle(request):
        requests.append(request)
        if not answers:
            raise httpx.ConnectError("refused", request=request)
        status, body, headers = (answers.pop(0) + ({},))[:3]
        return httpx.Response(status, json=body, headers=headers)

    client = BillingInbox("http://api.test/", "bik_test", source="kinde",
                          transport=httpx.MockTransport(handle), sleep=waits.append)
    return client, requests, waits


def test_a_debit_retried_after_503_and_429_keeps_its_one_key_and_waits_as_told():
    client, requests, waits = scripted([
        (503, {"code": "unavailable", "detail": "try again"}, {"retry-after": "2"}),
        (429, {"code": "rate_limited", "detail": "slow down"}, {"retry-after": "1"}),
        (200, DEBIT),
    ])
    debit = client.debit("kc_1", 3)
    assert debit.remaining == 497
    keys = {r.headers["idempotency-key"] for r in requests}
    assert len(requests) == 3 and len(keys) == 1
    assert keys.pop().startswith("idem_")
    assert waits == [2.0, 1.0]
    assert requests[0].headers["authorization"] == "Bearer bik_test"
    assert json.loads(requests[2].content) == {"amount": 3}


def test_two_debits_get_two_keys():
    client, requests, _ = scripted([(200, DEBIT), (200, DEBIT)])
    client.debit("kc_1", 3)
    client.debit("kc_1", 3)
    assert requests[0].headers["idempotency-key"] != requests[1].headers["idempotency-key"]


def test_retry_after_in_seconds_or_as_a_date_and_a_growing_backoff_without_it():
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds("Thu, 01 Jan 1970 00:00:10 GMT", now=4.0) == 6.0
    assert retry_after_seconds(None) is None
    policy = RetryPolicy()
    assert backoff(policy, 1, 60.0) == policy.max_delay
    assert backoff(policy, 3, None) >= 4 * policy.base_delay


def test_an_error_is_one_typed_error_with_code_and_detail_and_retries_end():
    client, requests, _ = scripted([(409, {"code": "allowance_exhausted", "detail": "nothing left", "remaining": 2})])
    with pytest.raises(BillingInboxError) as e:
        client.debit("kc_1", 3)
    assert (e.value.status, e.value.code, e.value.detail) == (409, "allowance_exhausted", "nothing left")
    assert e.value.body["remaining"] == 2
    assert len(requests) == 1
    down, requests, _ = scripted([(503, {"code": "unavailable", "detail": "down"})] * 5)
    with pytest.raises(BillingInboxError) as e:
        down.account("kc_1")
    assert e.value.code == "unavailable" and e.value.unavailable
    assert len(requests) == 1 + RetryPolicy().retries
    gone, _, _ = scripted([])
    with pytest.raises(BillingInboxError) as e:
        gone.account("kc_1")
    assert (e.value.status, e.value.code) == (0, "unreachable")


def test_an_unknown_enum_value_passes_through():
    feature = {"key": "sso", "allowed": True, "value": True, "source": "a_new_source", "decided_by": None}
    events = {"next": None, "events": [{
        "event_id": 1, "provider_event_id": "e", "type": "t", "occurred_at": "2026-12-01T00:00:00Z",
        "received_at": None, "status": "a_new_status", "outcome": "a_new_outcome", "reason": None,
        "seen_count": 1, "via": "a_new_way"}]}
    client, _, _ = scripted([(200, ACCOUNT), (200, feature), (200, events)])
    assert client.account("kc_1").subscriptions[0].status == "paused_by_a_new_rule"
    assert client.feature("kc_1", "sso").source == "a_new_source"
    event = next(client.events("kc_1"))
    assert (event.status, event.outcome, event.via) == ("a_new_status", "a_new_outcome", "a_new_way")


def test_the_usage_is_paged_to_the_end():
    def page(items, nxt):
        return {"period": "2026-12", "allowance": 500, "used": 2, "remaining": 498, "next": nxt,
                "usage": [{"usage_id": i, "amount": 1, "unit": "credits", "idempotency_key": i, "note": None,
                           "recorded_at": "2026-12-01T00:00:00Z"} for i in items]}
    client, requests, _ = scripted([(200, page(["a"], "cur_1")), (200, page(["b"], None))])
    assert [u.usage_id for u in client.usage("kc_1", limit=1)] == ["a", "b"]
    assert requests[1].url.params["after"] == "cur_1"
    assert requests[1].url.params["limit"] == "1"


def test_a_guarded_feature_answers_from_its_cache_when_down_and_refuses_what_it_never_saw():
    feature = {"key": "sso", "allowed": True, "value": True, "source": "catalog", "decided_by": None}
    clock = [datetime(2026, 12, 6, 10, tzinfo=timezone.utc).timestamp()]
    cache = MemoryCheckCache()
    up, _, _ = scripted([(200, feature)])
    first = GuardedChecks(up, cache=cache, now=lambda: clock[0]).feature("kc_1", "sso")
    assert (first.allowed, first.stale) == (True, False)

    clock[0] += 60
    down, _, _ = scripted([])
    guarded = GuardedChecks(down, cache=cache, now=lambda: clock[0], max_staleness=300)
    cached = guarded.feature("kc_1", "sso")
    assert (cached.allowed, cached.stale, cached.as_of) == (True, True, "2026-12-06T10:00:00.000Z")
    never = guarded.feature("kc_1", "audit-log")
    assert (never.allowed, never.stale, never.as_of) == (False, True, None)
    assert GuardedChecks(down, cache=cache, fail_open=True).feature("kc_1", "audit-log").allowed

    clock[0] += 600
    too_old = guarded.feature("kc_1", "sso")
    assert (too_old.allowed, too_old.as_of) == (False, None)
    with pytest.raises(BillingInboxError):
        guarded.account("kc_1")


def test_a_guarded_check_never_hides_a_4xx_behind_the_cache():
    cache = MemoryCheckCache()
    cache.set("kinde/kc_1/feature/sso", {"key": "sso", "allowed": True, "value": True, "source": "catalog",
                                         "decided_by": None}, "2026-12-06T10:00:00.000Z")
    client, _, _ = scripted([(404, {"code": "unknown_customer", "detail": "no such customer"})])
    with pytest.raises(BillingInboxError) as e:
        GuardedChecks(client, cache=cache).feature("kc_1", "sso")
    assert e.value.code == "unknown_customer"
