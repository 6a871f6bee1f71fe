/**
 * Applies effects as docs/effects.md tells an app to: a state (plan, features, a subscription)
 * only when its sequence is higher than the one applied for it, a fact (and a type not known)
 * once by id, never dropped for an older sequence.
 */
import { STATE_TYPES, verify, type Effect, type Refusal, type VerifyOptions } from "./webhooks.js";

/** Where the receiver remembers what it applied. Keep it beside the app's own data (a SQL table: see README). */
export interface EffectStore {
  /** Whether an effect with this id was received before. */
  seen(id: string): Promise<boolean>;
  /** The highest sequence applied for a state key. */
  sequence(stateKey: string): Promise<number | undefined>;
  /** Remembers the id, and the state's sequence when it carried one that was applied. */
  record(id: string, state: { key: string; sequence: number } | null): Promise<void>;
}

export class MemoryEffectStore implements EffectStore {
  private readonly ids = new Set<string>();
  private readonly states = new Map<string, number>();

  async seen(id: string): Promise<boolean> {
    return this.ids.has(id);
  }

  async sequence(stateKey: string): Promise<number | undefined> {
    return this.states.get(stateKey);
  }

  async record(id: string, state: { key: string; sequence: number } | null): Promise<void> {
    this.ids.add(id);
    if (state && (this.states.get(state.key) ?? 0) < state.sequence) this.states.set(state.key, state.sequence);
  }
}

/** What one state a kind carries is: per account (plan, features), per subscription. Null for a fact. */
export function stateKey(effect: Effect): string | null {
  if (!STATE_TYPES.includes(effect.type)) return null;
  const { source, customer_id } = effect.data;
  if (effect.type === "billing.subscription_updated") {
    const subscription = (effect.data as { subscription?: { id?: string } }).subscription;
    return `${source}/${customer_id}/subscription/${subscription?.id ?? ""}`;
  }
  return `${source}/${customer_id}/${effect.type}`;
}

/** applied: the handler ran; duplicate: this id was received before; older: a newer state is already applied. */
export type Outcome = "applied" | "duplicate" | "older";

export type Handler = (effect: Effect) => void | Promise<void>;

export class EffectReceiver {
  private queue: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly store: EffectStore,
    private readonly handler: Handler,
  ) {}

  /** Applies one verified effect (one at a time: two copies arriving together are applied once). When the handler throws, nothing is remembered, so the retry applies it. */
  receive(effect: Effect): Promise<Outcome> {
    const run = this.queue.then(() => this.apply(effect));
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async apply(effect: Effect): Promise<Outcome> {
    if (await this.store.seen(effect.id)) return "duplicate";
    const key = stateKey(effect);
    const sequence = effect.data.sequence;
    if (key !== null) {
      const applied = await this.store.sequence(key);
      if (applied !== undefined && applied >= sequence) {
        await this.store.record(effect.id, null);
        return "older";
      }
    }
    await this.handler(effect);
    await this.store.record(effect.id, key === null ? null : { key, sequence });
    return "applied";
  }

  /**
   * One delivery as an endpoint gets it: verified, then applied. `status` is what to answer:
   * 200 for applied, duplicate or older (all acknowledged), 401 or 400 for a refusal.
   */
  async deliver(
    body: string | Uint8Array,
    headers: Parameters<typeof verify>[1],
    secret: string | readonly string[],
    options?: VerifyOptions,
  ): Promise<{ status: number; outcome?: Outcome; effect?: Effect; refusal?: Refusal }> {
    const verified = verify(body, headers, secret, options);
    if (!verified.ok) return { status: verified.reason === "bad_body" ? 400 : 401, refusal: verified };
    const outcome = await this.receive(verified.effect);
    return { status: 200, outcome, effect: verified.effect };
  }
}
