import { test } from "node:test";
import assert from "node:assert/strict";
import { BillingInbox, BillingInboxError, backoffMs, retryAfterMs, DEFAULT_RETRY, GuardedChecks, MemoryCheckCache } from "../src/index.js";

type Answer = { status: number; body: unknown; headers?: Record<string, string> };

/** A fetch that answers from a script and remembers each request it was given. */
function scripted(answers: Answer[]) {
  const requests: Request[] = [];
  const fetch = async (input: RequestInfo | URL, init?: RequestInit) => {
    const request = input instanceof Request ? input : new Request(input, init);
    requests.push(request);
    const next = answers.shift();
    if (!next) throw new TypeError("fetch failed");
    return new Response(JSON.stringify(next.body), {
      status: next.status,
      headers: { "content-type": "application/json", ...next.headers },
    });
  };
  return { fetch: fetch as typeof globalThis.fetch, requests };
}

const account = {
  source: "kinde", customer_id: "kc_1", plan: "pro", entitled: true, deleted: false, period: "2026-12",
  allowance: 500, used: 0, remaining: 500, features: { sso: true }, version: 3,
  subscriptions: [{ id: "sub_1", status: "paused_by_a_new_rule", plan: "pro", current_period_end: null,
    cancel_at_period_end: null, cancel_at: null, trial_end: null, ended_at: null }],
};

function client(answers: Answer[]) {
  const s = scripted(answers);
  const c = new BillingInbox({ baseUrl: "http://api.test/", apiKey: "bik_test", source: "kinde", fetch: s.fetch, retry: { baseDelayMs: 1 } });
  return { c, requests: s.requests };
}

test("a debit retried after 503 and 429 keeps its one idempotency key, and is answered once", async () => {
  const debit = { usage_id: "use_1", amount: 3, period: "2026-12", used: 3, remaining: 497, replayed: false, unit: "credits", allocation: { from_allowance: 3, from_grants: [], order_version: 1 } };
  const { c, requests } = client([
    { status: 503, body: { code: "unavailable", detail: "try again" }, headers: { "retry-after": "0" } },
    { status: 429, body: { code: "rate_limited", detail: "slow down" }, headers: { "retry-after": "0" } },
    { status: 200, body: debit },
  ]);
  assert.deepEqual(await c.debit("kc_1", 3), debit);
  assert.equal(requests.length, 3);
  const keys = new Set(requests.map((r) => r.headers.get("idempotency-key")));
  assert.equal(keys.size, 1, "one key across the retries");
  assert.match([...keys][0]!, /^idem_/);
  assert.equal(requests[0]!.headers.get("authorization"), "Bearer bik_test");
  assert.deepEqual(await requests[2]!.json(), { amount: 3 });
});

test("two debits get two keys", async () => {
  const debit = { usage_id: "use_1", amount: 1, period: "2026-12", used: 1, remaining: 499, replayed: false, unit: "credits", allocation: { from_allowance: 1, from_grants: [], order_version: 1 } };
  const { c, requests } = client([{ status: 200, body: debit }, { status: 200, body: debit }]);
  await c.debit("kc_1", 1);
  await c.debit("kc_1", 1);
  assert.notEqual(requests[0]!.headers.get("idempotency-key"), requests[1]!.headers.get("idempotency-key"));
});

test("Retry-After is honoured, in seconds or as a date, and the backoff grows without it", () => {
  assert.equal(retryAfterMs("2"), 2000);
  assert.equal(retryAfterMs(new Date(10_000).toUTCString(), 4_000), 6000);
  assert.equal(retryAfterMs(null), undefined);
  assert.equal(backoffMs(DEFAULT_RETRY, 1, 2000), 2000);
  assert.equal(backoffMs(DEFAULT_RETRY, 1, 60_000), DEFAULT_RETRY.maxDelayMs);
  assert.ok(backoffMs(DEFAULT_RETRY, 3, undefined) >= 4 * DEFAULT_RETRY.baseDelayMs);
});

test("an error answer is one typed error with code and detail; retries end", async () => {
  const { c, requests } = client([
    { status: 409, body: { code: "allowance_exhausted", detail: "nothing left", remaining: 2 } },
  ]);
  await assert.rejects(c.debit("kc_1", 3), (e: unknown) => {
    assert.ok(e instanceof BillingInboxError);
    assert.equal(e.status, 409);
    assert.equal(e.code, "allowance_exhausted");
    assert.equal(e.detail, "nothing left");
    assert.equal((e.body as { remaining: number }).remaining, 2);
    return true;
  });
  assert.equal(requests.length, 1, "a 409 is not retried");
  const unavailable = client(Array(5).fill({ status: 503, body: { code: "unavailable", detail: "down" }, headers: { "retry-after": "0" } }));
  await assert.rejects(unavailable.c.account("kc_1"), (e: BillingInboxError) => e.code === "unavailable" && e.unavailable);
  assert.equal(unavailable.requests.length, 1 + DEFAULT_RETRY.retries);
});

test("an unknown enum value passes through", async () => {
  const feature = { key: "sso", allowed: true, value: true, source: "a_new_source", decided_by: null };
  const events = { next: null, events: [{ event_id: 1, provider_event_id: "e", type: "t", occurred_at: "2026-12-01T00:00:00Z",
    received_at: null, status: "a_new_status", outcome: "a_new_outcome", reason: null, seen_count: 1, via: "a_new_way" }] };
  const { c } = client([{ status: 200, body: account }, { status: 200, body: feature }, { status: 200, body: events }]);
  assert.equal((await c.account("kc_1")).subscriptions[0]!.status, "paused_by_a_new_rule");
  const source: string | null = (await c.feature("kc_1", "sso")).source;
  assert.equal(source, "a_new_source");
  for await (const event of c.events("kc_1")) assert.deepEqual([event.status, event.outcome, event.via], ["a_new_status", "a_new_outcome", "a_new_way"]);
});

test("the usage and the event log are paged to the end", async () => {
  const usage = (id: string) => ({ usage_id: id, amount: 1, unit: "credits", idempotency_key: id, note: null, recorded_at: "2026-12-01T00:00:00Z" });
  const page = (items: unknown[], next: string | null) => ({ period: "2026-12", allowance: 500, used: 2, remaining: 498, usage: items, next });
  const { c, requests } = client([
    { status: 200, body: page([usage("a")], "cur_1") },
    { status: 200, body: page([usage("b")], null) },
  ]);
  const ids: string[] = [];
  for await (const u of c.usage("kc_1", { limit: 1 })) ids.push(u.usage_id);
  assert.deepEqual(ids, ["a", "b"]);
  assert.equal(new URL(requests[1]!.url).searchParams.get("after"), "cur_1");
  assert.equal(new URL(requests[1]!.url).searchParams.get("limit"), "1");
});

test("a guarded feature check answers from its cache when the API is down, says so, and refuses what it never saw", async () => {
  const feature = { key: "sso", allowed: true, value: true, source: "catalog", decided_by: null };
  let now = Date.parse("2026-12-06T10:00:00Z");
  const cache = new MemoryCheckCache();
  const up = client([{ status: 200, body: feature }]);
  const first = await new GuardedChecks(up.c, { cache, now: () => now }).feature("kc_1", "sso");
  assert.equal(first.allowed, true);
  assert.equal(first.stale, false);

  now += 60_000;
  const down = client([]); // every request fails: no answer
  const guarded = new GuardedChecks(down.c, { cache, now: () => now, maxStalenessMs: 5 * 60_000 });
  const cached = await guarded.feature("kc_1", "sso");
  assert.deepEqual([cached.allowed, cached.stale, cached.as_of], [true, true, "2026-12-06T10:00:00.000Z"]);
  const never = await guarded.feature("kc_1", "audit-log");
  assert.deepEqual([never.allowed, never.stale, never.as_of], [false, true, null], "fail closed");
  const open = await new GuardedChecks(down.c, { cache, failOpen: true }).feature("kc_1", "audit-log");
  assert.equal(open.allowed, true, "open when the caller chose it");

  now += 10 * 60_000;
  const tooOld = await guarded.feature("kc_1", "sso");
  assert.deepEqual([tooOld.allowed, tooOld.as_of], [false, null], "an entry past the staleness allowed is not given");
  await assert.rejects(guarded.account("kc_1"), (e: BillingInboxError) => e.code === "unreachable");
});

test("a guarded check never hides a 4xx behind the cache", async () => {
  const cache = new MemoryCheckCache();
  await cache.set("kinde/kc_1/feature/sso", { value: { key: "sso", allowed: true }, at: new Date().toISOString() });
  const { c } = client([{ status: 404, body: { code: "unknown_customer", detail: "no such customer" } }]);
  await assert.rejects(new GuardedChecks(c, { cache }).feature("kc_1", "sso"), (e: BillingInboxError) => e.code === "unknown_customer");
});
