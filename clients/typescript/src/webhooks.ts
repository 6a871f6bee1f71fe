/** Effects as the app receives them (docs/effects.md): Standard Webhooks signatures checked, the body typed. */
import { createHmac, timingSafeEqual } from "node:crypto";
import type { components } from "./generated/schema.js";

type S = components["schemas"];
export type PlanChangedEffect = S["PlanChangedEffect"];
export type FeaturesChangedEffect = S["FeaturesChangedEffect"];
export type SubscriptionUpdatedEffect = S["SubscriptionUpdatedEffect"];
export type AllowanceGrantedEffect = S["AllowanceGrantedEffect"];
export type PaymentEffect = S["PaymentEffect"];
export type CustomerDeletedEffect = S["CustomerDeletedEffect"];
export type AllowanceExhaustedEffect = S["AllowanceExhaustedEffect"];
export type UsageReversedEffect = S["UsageReversedEffect"];
export type CreditsGrantedEffect = S["CreditsGrantedEffect"];
export type CreditsExpiredEffect = S["CreditsExpiredEffect"];
export type CreditsVoidedEffect = S["CreditsVoidedEffect"];
/** `billing.credits_low` and `billing.credits_depleted`: one downward crossing each, a fact. */
export type CreditsCrossedEffect = S["CreditsCrossedEffect"];
/** Any effect, one of a type this version does not know included: the envelope every effect has. */
export type AnyEffect = S["Effect"];

/** The effect each known type is. */
export interface EffectTypes {
  "billing.plan_changed": PlanChangedEffect;
  "billing.features_changed": FeaturesChangedEffect;
  "billing.subscription_updated": SubscriptionUpdatedEffect;
  "billing.allowance_granted": AllowanceGrantedEffect;
  "billing.payment_succeeded": PaymentEffect;
  "billing.payment_failed": PaymentEffect;
  "billing.payment_refunded": PaymentEffect;
  "billing.customer_deleted": CustomerDeletedEffect;
  "billing.allowance_exhausted": AllowanceExhaustedEffect;
  "billing.usage_reversed": UsageReversedEffect;
  "billing.credits_granted": CreditsGrantedEffect;
  "billing.credits_expired": CreditsExpiredEffect;
  "billing.credits_voided": CreditsVoidedEffect;
  "billing.credits_low": CreditsCrossedEffect;
  "billing.credits_depleted": CreditsCrossedEffect;
}

export type EffectType = keyof EffectTypes;
export type Effect = EffectTypes[EffectType] | AnyEffect;

/** The kinds that carry a state: the highest sequence wins. Every other kind, one not known included, is a fact. */
export const STATE_TYPES: readonly string[] = ["billing.plan_changed", "billing.features_changed", "billing.subscription_updated"];

/** Narrows an effect to a known type: `if (isEffect(e, "billing.plan_changed")) e.data.plan`. */
export function isEffect<T extends EffectType>(effect: Effect, type: T): effect is EffectTypes[T] {
  return effect.type === type;
}

export type RefusalReason = "missing_header" | "bad_timestamp" | "stale_timestamp" | "bad_signature" | "bad_secret" | "bad_body";

/** Why a delivery was refused: answer it 4xx (401 for a signature, 400 for a body) and apply nothing. */
export interface Refusal {
  ok: false;
  reason: RefusalReason;
  detail: string;
}

export interface Verified {
  ok: true;
  effect: Effect;
  /** webhook-id, the same as the effect's id. */
  id: string;
  /** webhook-timestamp, seconds. */
  timestamp: number;
}

export interface VerifyOptions {
  /** How far webhook-timestamp may be from now, seconds; 300 by default. */
  toleranceSecs?: number;
  /** Now in seconds, for tests. */
  nowSecs?: number;
}

type HeaderSource = Headers | Record<string, string | string[] | undefined>;

function header(headers: HeaderSource, name: string): string | undefined {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
  const record = headers as Record<string, string | string[] | undefined>;
  const key = Object.keys(record).find((k) => k.toLowerCase() === name);
  const value = key === undefined ? undefined : record[key];
  return Array.isArray(value) ? value.join(" ") : value;
}

/** The key a `whsec_…` secret names (its base64 part, decoded); undefined for one that is not base64. */
export function secretKey(secret: string): Buffer | undefined {
  const encoded = secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret;
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(encoded) || encoded.length % 4 !== 0) return undefined;
  const key = Buffer.from(encoded, "base64");
  return key.length === 0 ? undefined : key;
}

/** The v1 signature of a delivery: base64 HMAC-SHA256 over `{id}.{timestamp}.{body}`. */
export function sign(key: Buffer, id: string, timestamp: number, body: string | Uint8Array): string {
  return createHmac("sha256", key).update(`${id}.${timestamp}.`).update(body).digest("base64");
}

function refuse(reason: RefusalReason, detail: string): Refusal {
  return { ok: false, reason, detail };
}

/**
 * Verifies one delivery as Standard Webhooks says: the raw body (as received, before any JSON
 * parsing), its headers, and the secret (`whsec_…`) or several while one rotates. A signature
 * header may carry several `v1,…`; one that matches a secret is enough.
 */
export function verify(
  body: string | Uint8Array,
  headers: HeaderSource,
  secret: string | readonly string[],
  options: VerifyOptions = {},
): Verified | Refusal {
  const id = header(headers, "webhook-id");
  const stamp = header(headers, "webhook-timestamp");
  const signatures = header(headers, "webhook-signature");
  if (!id || !stamp || !signatures) return refuse("missing_header", "webhook-id, webhook-timestamp and webhook-signature are required");
  if (!/^\d+$/.test(stamp)) return refuse("bad_timestamp", "webhook-timestamp is not whole seconds");
  const timestamp = Number(stamp);
  const now = options.nowSecs ?? Math.floor(Date.now() / 1000);
  const tolerance = options.toleranceSecs ?? 300;
  if (Math.abs(now - timestamp) > tolerance) return refuse("stale_timestamp", `webhook-timestamp is more than ${tolerance} s from now`);
  const keys = (typeof secret === "string" ? [secret] : secret).map(secretKey);
  if (keys.length === 0 || keys.some((k) => k === undefined)) return refuse("bad_secret", "a secret is not whsec_ followed by base64");
  const expected = (keys as Buffer[]).map((key) => Buffer.from(sign(key, id, timestamp, body), "base64"));
  const matched = signatures.split(" ").some((candidate) => {
    const [version, value] = candidate.split(",", 2);
    if (version !== "v1" || !value) return false;
    const given = Buffer.from(value, "base64");
    // a signature of another length (a bare "v1,") never matches
    return expected.some((e) => e.length === given.length && timingSafeEqual(e, given));
  });
  if (!matched) return refuse("bad_signature", "no signature matches");
  let effect: unknown;
  try {
    effect = JSON.parse(typeof body === "string" ? body : Buffer.from(body).toString("utf8"));
  } catch {
    return refuse("bad_body", "the body is not JSON");
  }
  if (!isEnvelope(effect)) return refuse("bad_body", "the body is not an effect (id, type, occurred_at, data)");
  if (effect.id !== id) return refuse("bad_body", "the body's id is not webhook-id");
  return { ok: true, effect, id, timestamp };
}

function isEnvelope(value: unknown): value is AnyEffect {
  const e = value as AnyEffect | null;
  return (
    typeof e === "object" && e !== null &&
    typeof e.id === "string" && typeof e.type === "string" && typeof e.occurred_at === "string" &&
    typeof e.data === "object" && e.data !== null &&
    typeof e.data.source === "string" && typeof e.data.customer_id === "string" && typeof e.data.sequence === "number"
  );
}
