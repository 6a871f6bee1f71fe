import base64
import json
import sqlite3

import pytest

from billing_inbox import (
    EffectReceiver,
    MemoryEffectStore,
    Refusal,
    SqlEffectStore,
    models,
    parse,
    secret_key,
    sign,
    verify,
)

SECRET = "whsec_" + base64.b64encode(b"a test secret, 32 bytes long!!!!").decode()
OTHER = "whsec_" + base64.b64encode(b"another secret").decode()
NOW = 1_764_583_203


def effect(effect_id, kind, sequence, **extra):
    return {"id": effect_id, "type": kind, "occurred_at": "2026-12-01T10:00:03.118Z",
            "data": {"source": "kinde", "customer_id": "kc_1", "sequence": sequence, "event_id": 4,
                     "provider_event_id": "e", "account": {"plan": "pro", "period": "2026-12"}, **extra}}


def delivery(body, secrets=(SECRET,), timestamp=NOW):
    raw = json.dumps(body).encode()
    signature = " ".join(f"v1,{sign(secret_key(s), body['id'], timestamp, raw)}" for s in secrets)
    return raw, {"Webhook-Id": body["id"], "Webhook-Timestamp": str(timestamp), "Webhook-Signature": signature}


def reason(result):
    return result.reason if isinstance(result, Refusal) else "ok"


def test_a_signed_effect_is_verified_and_typed():
    raw, headers = delivery(effect("eff_1", "billing.plan_changed", 2, plan="pro", previous_plan="free"))
    verified = verify(raw, headers, SECRET, now=NOW)
    assert verified.ok and verified.effect.known
    assert isinstance(verified.effect.typed, models.PlanChangedEffect)
    assert verified.effect.typed.data.plan == "pro"


def test_refusals():
    raw, headers = delivery(effect("eff_1", "billing.plan_changed", 2))
    assert reason(verify(raw, headers, OTHER, now=NOW)) == "bad_signature"
    assert reason(verify(raw.replace(b"pro", b"max"), headers, SECRET, now=NOW)) == "bad_signature"
    assert reason(verify(raw, headers, SECRET, now=NOW + 301)) == "stale_timestamp"
    assert reason(verify(raw, headers, SECRET, now=NOW - 301)) == "stale_timestamp"
    assert reason(verify(raw, headers, SECRET, now=NOW + 300)) == "ok"
    assert reason(verify(raw, {**headers, "Webhook-Signature": "v1,"}, SECRET, now=NOW)) == "bad_signature"
    v2 = "v2," + headers["Webhook-Signature"][3:]
    assert reason(verify(raw, {**headers, "Webhook-Signature": v2}, SECRET, now=NOW)) == "bad_signature"
    assert reason(verify(raw, {"webhook-id": "eff_1"}, SECRET, now=NOW)) == "missing_header"
    assert reason(verify(raw, headers, "whsec_not base64!", now=NOW)) == "bad_secret"


def test_rotation_several_signatures_or_several_secrets():
    raw, headers = delivery(effect("eff_1", "billing.plan_changed", 2), secrets=(OTHER, SECRET))
    assert verify(raw, headers, SECRET, now=NOW).ok
    raw, headers = delivery(effect("eff_1", "billing.plan_changed", 2), secrets=(OTHER,))
    assert verify(raw, headers, [SECRET, OTHER], now=NOW).ok


def test_an_unknown_type_and_a_body_its_model_cannot_read_pass_untyped():
    raw, headers = delivery(effect("eff_9", "billing.something_new", 5, thing=1))
    verified = verify(raw, headers, SECRET, now=NOW)
    assert verified.ok and not verified.effect.known and verified.effect.typed is None
    assert verified.effect.data["thing"] == 1
    odd = parse(effect("eff_8", "billing.plan_changed", 5))  # no plan, no previous_plan
    assert odd.known and odd.typed is None


def sub(effect_id, sequence, subscription):
    return parse(effect(effect_id, "billing.subscription_updated", sequence, subscription={"id": subscription}))


@pytest.fixture(params=["memory", "sqlite"])
def store(request):
    if request.param == "memory":
        return MemoryEffectStore()
    sql = SqlEffectStore(sqlite3.connect(":memory:"))
    sql.create_tables()
    return sql


def test_the_receiver_applies_states_by_sequence_and_facts_once_by_id(store):
    applied = []
    receiver = EffectReceiver(store, lambda e: applied.append(e.id))
    newer = parse(effect("eff_new", "billing.plan_changed", 5))
    assert receiver.receive(newer) == "applied"
    assert receiver.receive(newer) == "duplicate"
    assert receiver.receive(parse(effect("eff_old", "billing.plan_changed", 3))) == "older"
    assert receiver.receive(parse(effect("eff_f", "billing.features_changed", 4))) == "applied"
    assert receiver.receive(parse(effect("eff_grant", "billing.allowance_granted", 2))) == "applied"
    assert receiver.receive(parse(effect("eff_u", "billing.something_new", 1))) == "applied"
    assert receiver.receive(sub("eff_s1", 7, "sub_a")) == "applied"
    assert receiver.receive(sub("eff_s2", 6, "sub_b")) == "applied"
    assert receiver.receive(sub("eff_s3", 6, "sub_a")) == "older"
    assert receiver.receive(parse(effect("eff_old", "billing.plan_changed", 3))) == "duplicate"
    assert applied == ["eff_new", "eff_f", "eff_grant", "eff_u", "eff_s1", "eff_s2"]


def test_a_handler_that_raises_leaves_the_effect_unapplied(store):
    fail = [True]

    def handler(_):
        if fail[0]:
            raise RuntimeError("database down")

    receiver = EffectReceiver(store, handler)
    grant = parse(effect("eff_1", "billing.allowance_granted", 1))
    with pytest.raises(RuntimeError):
        receiver.receive(grant)
    fail[0] = False
    assert receiver.receive(grant) == "applied"


def test_deliver_answers_200_for_what_it_had_and_401_for_a_bad_signature():
    receiver = EffectReceiver(MemoryEffectStore(), lambda e: None)
    raw, headers = delivery(effect("eff_1", "billing.plan_changed", 2))
    assert receiver.deliver(raw, headers, SECRET, now=NOW).outcome == "applied"
    assert receiver.deliver(raw, headers, SECRET, now=NOW).outcome == "duplicate"
    assert receiver.deliver(raw, headers, OTHER, now=NOW).status == 401
