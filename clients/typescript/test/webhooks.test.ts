import { test } from "node:test";
import assert from "node:assert/strict";
import { EffectReceiver, MemoryEffectStore, isEffect, secretKey, sign, verify, type Effect } from "../src/index.js";

const secret = "whsec_" + Buffer.from("a test secret, 32 bytes long!!!!").toString("base64");
const other = "whsec_" + Buffer.from("another secret").toString("base64");
const now = 1_764_583_203;

function effect(id: string, type: string, sequence: number, extra: Record<string, unknown> = {}) {
  return { id, type, occurred_at: "2026-12-01T10:00:03.118Z",
    data: { source: "kinde", customer_id: "kc_1", sequence, event_id: 4, provider_event_id: "e", account: { plan: "pro", period: "2026-12" }, ...extra } };
}

function delivery(body: object, secrets: string[] = [secret], timestamp = now) {
  const raw = JSON.stringify(body);
  const id = (body as { id: string }).id;
  const signature = secrets.map((s) => `v1,${sign(secretKey(s)!, id, timestamp, raw)}`).join(" ");
  return { raw, headers: { "webhook-id": id, "webhook-timestamp": String(timestamp), "webhook-signature": signature } };
}

test("a signed effect is verified and typed", () => {
  const { raw, headers } = delivery(effect("eff_1", "billing.plan_changed", 2, { plan: "pro", previous_plan: "free" }));
  const v = verify(raw, headers, secret, { nowSecs: now });
  assert.ok(v.ok);
  assert.ok(isEffect(v.effect, "billing.plan_changed"));
  assert.equal(v.effect.data.plan, "pro");
});

test("refusals: another secret, a changed body, a stale or future timestamp, a bare v1, a missing header", () => {
  const { raw, headers } = delivery(effect("eff_1", "billing.plan_changed", 2));
  const reason = (r: ReturnType<typeof verify>) => (r.ok ? "ok" : r.reason);
  assert.equal(reason(verify(raw, headers, other, { nowSecs: now })), "bad_signature");
  assert.equal(reason(verify(raw.replace("pro", "max"), headers, secret, { nowSecs: now })), "bad_signature");
  assert.equal(reason(verify(raw, headers, secret, { nowSecs: now + 301 })), "stale_timestamp");
  assert.equal(reason(verify(raw, headers, secret, { nowSecs: now - 301 })), "stale_timestamp");
  assert.equal(reason(verify(raw, headers, secret, { nowSecs: now + 300 })), "ok");
  assert.equal(reason(verify(raw, { ...headers, "webhook-signature": "v1," }, secret, { nowSecs: now })), "bad_signature");
  assert.equal(reason(verify(raw, { ...headers, "webhook-signature": "v2," + headers["webhook-signature"].slice(3) }, secret, { nowSecs: now })), "bad_signature");
  assert.equal(reason(verify(raw, { "webhook-id": "eff_1" }, secret, { nowSecs: now })), "missing_header");
  assert.equal(reason(verify(raw, headers, "whsec_not base64!", { nowSecs: now })), "bad_secret");
});

test("rotation: several signatures in the header, or several secrets at the receiver", () => {
  const both = delivery(effect("eff_1", "billing.plan_changed", 2), [other, secret]);
  assert.ok(verify(both.raw, both.headers, secret, { nowSecs: now }).ok);
  const old = delivery(effect("eff_1", "billing.plan_changed", 2), [other]);
  assert.ok(verify(old.raw, old.headers, [secret, other], { nowSecs: now }).ok);
});

test("an unknown effect type passes verification untyped", () => {
  const { raw, headers } = delivery(effect("eff_9", "billing.something_new", 5, { thing: 1 }));
  const v = verify(raw, headers, secret, { nowSecs: now });
  assert.ok(v.ok);
  assert.equal(v.effect.type, "billing.something_new");
});

test("the receiver: a copy once, an older state dropped, a late fact applied, an unknown type as a fact", async () => {
  const applied: string[] = [];
  const receiver = new EffectReceiver(new MemoryEffectStore(), (e: Effect) => void applied.push(e.id));
  const newer = effect("eff_new", "billing.plan_changed", 5);
  assert.equal(await receiver.receive(newer as Effect), "applied");
  assert.equal(await receiver.receive(newer as Effect), "duplicate");
  assert.equal(await receiver.receive(effect("eff_old", "billing.plan_changed", 3) as Effect), "older");
  assert.equal(await receiver.receive(effect("eff_f", "billing.features_changed", 4) as Effect), "applied", "another state");
  assert.equal(await receiver.receive(effect("eff_grant", "billing.allowance_granted", 2) as Effect), "applied", "a fact is never dropped for its sequence");
  assert.equal(await receiver.receive(effect("eff_u", "billing.something_new", 1) as Effect), "applied");
  const sub = (id: string, sequence: number, subscription: string) =>
    effect(id, "billing.subscription_updated", sequence, { subscription: { id: subscription } }) as Effect;
  assert.equal(await receiver.receive(sub("eff_s1", 7, "sub_a")), "applied");
  assert.equal(await receiver.receive(sub("eff_s2", 6, "sub_b")), "applied", "each subscription is its own state");
  assert.equal(await receiver.receive(sub("eff_s3", 6, "sub_a")), "older");
  assert.deepEqual(applied, ["eff_new", "eff_f", "eff_grant", "eff_u", "eff_s1", "eff_s2"]);
});

test("a handler that throws leaves the effect unapplied, so its retry applies it", async () => {
  let fail = true;
  const receiver = new EffectReceiver(new MemoryEffectStore(), () => {
    if (fail) throw new Error("database down");
  });
  const e = effect("eff_1", "billing.allowance_granted", 1) as Effect;
  await assert.rejects(receiver.receive(e));
  fail = false;
  assert.equal(await receiver.receive(e), "applied");
});

test("deliver answers 200 for what it applied or already had, 401 for a bad signature", async () => {
  const receiver = new EffectReceiver(new MemoryEffectStore(), () => {});
  const { raw, headers } = delivery(effect("eff_1", "billing.plan_changed", 2));
  assert.equal((await receiver.deliver(raw, headers, secret, { nowSecs: now })).outcome, "applied");
  assert.equal((await receiver.deliver(raw, headers, secret, { nowSecs: now })).outcome, "duplicate");
  assert.equal((await receiver.deliver(raw, headers, other, { nowSecs: now })).status, 401);
});
