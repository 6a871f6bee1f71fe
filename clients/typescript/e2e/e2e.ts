/**
 * The TypeScript client against the running local stack (scripts/e2e, through scripts/clients e2e).
 *   live:     read an account, check a feature, a debit whose first answer is lost and retried
 *             under its key (one debit), the usage and the event log paged, the effects the
 *             dispatcher delivered verified and applied; the guarded checks fill their cache
 *   degraded: with the api stopped, the guarded checks answer from that cache, stale
 */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import {
  BillingInbox, BillingInboxError, EffectReceiver, FileCheckCache, GuardedChecks, MemoryEffectStore,
  newIdempotencyKey, verify, type Effect, type Outcome, type Verified,
} from "../src/index.js";

const env = (name: string, fallback?: string): string => {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
};
const baseUrl = env("INBOX_API_URL");
const apiKey = env("INBOX_DEV_API_KEY");
const customer = env("INBOX_CLIENTS_CUSTOMER", "kc_e2e");
const effectsCustomer = env("INBOX_CLIENTS_EFFECTS_CUSTOMER", "kc_clients");
const cache = new FileCheckCache(join(env("INBOX_CLIENTS_STATE"), "typescript-cache.json"));

let failed = 0;
function check(what: string, ok: boolean, detail: unknown = "") {
  console.log(`clients (typescript): ${ok ? "ok" : "FAILED"}: ${what}${ok ? "" : ` ${JSON.stringify(detail)}`}`);
  if (!ok) failed++;
}

const api = new BillingInbox({ baseUrl, apiKey, source: "kinde" });

async function live() {
  const before = await api.account(customer);
  check(`reads ${customer}: ${before.plan}, ${before.remaining} left`, before.plan === "pro", before);
  const sso = await api.feature(customer, "sso");
  check("checks a feature: sso allowed", sso.allowed === true, sso);

  // The first answer is lost (a 503 in its place, after the API recorded the debit): the
  // client sends the same request again, under the same key, and is answered the same debit.
  let lost = 0;
  const lossy: typeof fetch = async (input, init) => {
    const answer = await fetch(input, init);
    const request = input instanceof Request ? input : new Request(input, init);
    if (request.method === "POST" && lost++ === 0) {
      return new Response(JSON.stringify({ code: "unavailable", detail: "the answer was lost" }), {
        status: 503, headers: { "content-type": "application/json", "retry-after": "0" },
      });
    }
    return answer;
  };
  const key = newIdempotencyKey();
  const debit = await new BillingInbox({ baseUrl, apiKey, source: "kinde", fetch: lossy }).debit(customer, 1, {
    idempotencyKey: key, note: "typescript client e2e",
  });
  check("a debit retried after a lost answer is answered as replayed", lost === 2 && debit.replayed === true, { lost, debit });
  const after = await api.account(customer);
  check(`one debit: used ${before.used} → ${after.used}`, after.used === before.used + 1, after);

  let pages = 0;
  const keys: string[] = [];
  for await (const page of api.usagePages(customer, { limit: 1 })) {
    pages++;
    keys.push(...page.usage.map((u) => u.idempotency_key));
  }
  check(`the usage paged one at a time (${pages} pages), the key once`, pages >= 2 && keys.filter((k) => k === key).length === 1, keys);
  const events = [];
  for await (const event of api.events(customer, { limit: 1 })) events.push(event);
  check(`the event log paged (${events.length} events)`, events.length >= 1 && events.every((e) => typeof e.event_id === "number"), events);

  await receiveEffects();

  const guarded = new GuardedChecks(api, { cache, timeoutMs: 5_000 });
  const cached = await guarded.feature(customer, "sso");
  const account = await guarded.account(customer);
  check("the guarded checks answer fresh while the api is up", !cached.stale && cached.allowed && !account.stale, { cached, account });
}

function receiveEffects() {
  const dir = env("INBOX_CLIENTS_RECORDED");
  const secret = env("INBOX_CLIENTS_SECRET");
  const deliveries = readdirSync(dir).filter((f) => f.endsWith(".json")).sort().map((f) => {
    const record = JSON.parse(readFileSync(join(dir, f), "utf8")) as { received_at: number; headers: Record<string, string>; body: string };
    return { raw: Buffer.from(record.body, "base64"), headers: record.headers, at: Math.floor(record.received_at) };
  });
  // Verified as at its arrival: the signature, the secret, the timestamp then.
  const results = deliveries.map((d) => verify(d.raw, d.headers, secret, { nowSecs: d.at }));
  check(`every delivery the dispatcher made verifies (${results.length})`, results.length > 0 && results.every((r) => r.ok), results.filter((r) => !r.ok));
  const wrong = deliveries[0] && verify(deliveries[0].raw, deliveries[0].headers, "whsec_" + Buffer.from("not the secret").toString("base64"), { nowSecs: deliveries[0].at });
  check("another secret is refused", wrong !== undefined && !wrong.ok && wrong.reason === "bad_signature", wrong);

  const mine = results.filter((r): r is Verified => r.ok && r.effect.data.customer_id === effectsCustomer).map((r) => r.effect);
  const ids = mine.map((e) => e.id);
  const copies = ids.filter((id, i) => ids.indexOf(id) !== i);
  check(`the replayed effect came twice (${copies.length} copy)`, copies.length >= 1, ids);

  // Applied newest first: the receiver must drop the older plan and still apply every grant.
  const receiver = new EffectReceiver(new MemoryEffectStore(), () => {});
  const outcomes: Array<[Effect, Outcome]> = [];
  return (async () => {
    for (const effect of [...mine].sort((a, b) => b.data.sequence - a.data.sequence)) {
      outcomes.push([effect, await receiver.receive(effect)]);
    }
    const of = (type: string, outcome: Outcome) => outcomes.filter(([e, o]) => e.type === type && o === outcome).map(([e]) => e);
    const plans = of("billing.plan_changed", "applied");
    check("the newest plan applied, team", plans.length === 1 && (plans[0]!.data as { plan?: string }).plan === "team", outcomes);
    check("the older plan dropped", of("billing.plan_changed", "older").length >= 1, outcomes);
    check("both grants applied, whatever their order", of("billing.allowance_granted", "applied").length === 2, outcomes);
    check("the replayed copy applied once", outcomes.filter(([, o]) => o === "duplicate").length === copies.length, outcomes);
  })();
}

async function degraded() {
  const guarded = new GuardedChecks(api, { cache, timeoutMs: 2_000 });
  const sso = await guarded.feature(customer, "sso");
  check(`with the api stopped, sso from the cache (stale, as of ${sso.as_of})`, sso.allowed && sso.stale && sso.as_of !== null, sso);
  const unseen = await guarded.feature(customer, "audit-log");
  check("a feature never seen is refused (fail closed)", !unseen.allowed && unseen.stale && unseen.as_of === null, unseen);
  const account = await guarded.account(customer);
  check("the account from the cache, stale", account.stale && account.plan === "pro", account);
  const error = await api.account(customer).catch((e: unknown) => e);
  check("an unguarded read is one typed error", error instanceof BillingInboxError && error.status === 0, String(error));
}

const phase = process.argv[2];
const run = phase === "live" ? live() : phase === "degraded" ? degraded() : Promise.reject(new Error(`phase: live or degraded, not ${phase}`));
run.then(
  () => process.exit(failed === 0 ? 0 : 1),
  (error) => {
    console.log(`clients (typescript): FAILED: ${error instanceof BillingInboxError ? `${error.status} ${error.code}: ${error.detail}` : error}`);
    process.exit(1);
  },
);
