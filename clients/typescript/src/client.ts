/** The app API (docs/api.md): the generated paths behind a thin layer of auth, retries, idempotency keys, paging and one error. */
import { randomUUID } from "node:crypto";
import createClient, { type Client } from "openapi-fetch";
import type { components, paths } from "./generated/schema.js";
import { BillingInboxError } from "./errors.js";
import { DEFAULT_RETRY, retryingFetch, retryAfterMs, type RetryPolicy } from "./retry.js";

export type Account = components["schemas"]["Account"];
export type FeatureCheck = components["schemas"]["FeatureCheck"];
export type Debit = components["schemas"]["Debit"];
export type Reversal = components["schemas"]["Reversal"];
export type UsagePage = components["schemas"]["UsagePage"];
export type Usage = UsagePage["usage"][number];
export type AccountEvents = components["schemas"]["AccountEvents"];
export type AccountEvent = AccountEvents["events"][number];

export interface ClientOptions {
  /** The API's base, without /v1: `https://….execute-api….amazonaws.com`, or locally `http://127.0.0.1:61900/lambda-url/api`. */
  baseUrl: string;
  /** A key of INBOX_API_KEYS (`bik_…`), sent as `Authorization: Bearer`. */
  apiKey: string;
  /** The source calls name when they name none (`kinde`, `stripe`, …). */
  source?: string;
  retry?: Partial<RetryPolicy>;
  /** For tests and other runtimes. */
  fetch?: typeof fetch;
}

export interface CallOptions {
  source?: string;
  /** A Stripe Connect customer's connected account. */
  stripeAccount?: string;
  signal?: AbortSignal;
}

export interface DebitOptions extends CallOptions {
  /** The month to spend (YYYY-MM); the current UTC month when left out. */
  period?: string;
  note?: string;
  /** What it spends past the allowance: grants of this unit. `credits` when left out. */
  unit?: string;
  /** One per debit: retried with it, the debit happens once. Made for you when left out. */
  idempotencyKey?: string;
}

export interface PageOptions extends CallOptions {
  limit?: number;
  /** The usage of this month (YYYY-MM). */
  period?: string;
}

/** A new idempotency key: one per debit, never one per attempt. */
export function newIdempotencyKey(): string {
  return `idem_${randomUUID()}`;
}

export class BillingInbox {
  /** The generated client, for any route the helpers do not cover; it retries and authenticates as the helpers do. */
  readonly api: Client<paths>;
  private readonly source: string | undefined;

  constructor(options: ClientOptions) {
    const policy = { ...DEFAULT_RETRY, ...options.retry };
    this.source = options.source;
    this.api = createClient<paths>({
      baseUrl: options.baseUrl.replace(/\/+$/, ""),
      headers: { authorization: `Bearer ${options.apiKey}` },
      fetch: wrapTransport(retryingFetch(policy, options.fetch ?? globalThis.fetch)),
    });
  }

  /** The source a call names, else the client's. */
  sourceOf(options: CallOptions = {}): string {
    const source = options.source ?? this.source;
    if (!source) throw new TypeError("no source: name one in the client's options or the call's");
    return source;
  }

  private where(customer: string, options: CallOptions) {
    return { source: this.sourceOf(options), customer };
  }

  private query(options: CallOptions): { stripe_account?: string } {
    return options.stripeAccount === undefined ? {} : { stripe_account: options.stripeAccount };
  }

  /** The account's plan, features, allowance and subscriptions. */
  async account(customer: string, options: CallOptions & { period?: string } = {}): Promise<Account> {
    const { data, error, response } = await this.api.GET("/v1/accounts/{source}/{customer}", {
      params: { path: this.where(customer, options), query: { ...this.query(options), period: options.period } },
      signal: options.signal,
    });
    return answer(data, error, response);
  }

  /** May the customer use the feature (200 with allowed false when it lacks it). */
  async feature(customer: string, key: string, options: CallOptions = {}): Promise<FeatureCheck> {
    const { data, error, response } = await this.api.GET("/v1/accounts/{source}/{customer}/features/{key}", {
      params: { path: { ...this.where(customer, options), key }, query: this.query(options) },
      signal: options.signal,
    });
    return answer(data, error, response);
  }

  /** Spends `amount` of the period's allowance, once: the key is kept across every retry. */
  async debit(customer: string, amount: number, options: DebitOptions = {}): Promise<Debit> {
    const key = options.idempotencyKey ?? newIdempotencyKey();
    const body: components["schemas"]["DebitRequest"] = { amount };
    if (options.period !== undefined) body.period = options.period;
    if (options.note !== undefined) body.note = options.note;
    if (options.unit !== undefined) body.unit = options.unit;
    const { data, error, response } = await this.api.POST("/v1/accounts/{source}/{customer}/usage", {
      params: { path: this.where(customer, options), query: this.query(options), header: { "Idempotency-Key": key } },
      body,
      signal: options.signal,
    });
    return answer(data, error, response);
  }

  /** Takes an accepted debit back, once. */
  async reverse(customer: string, usageId: string, options: CallOptions = {}): Promise<Reversal> {
    const { data, error, response } = await this.api.POST("/v1/accounts/{source}/{customer}/usage/{usage_id}/reversal", {
      params: { path: { ...this.where(customer, options), usage_id: usageId }, query: this.query(options) },
      signal: options.signal,
    });
    return answer(data, error, response);
  }

  /** The period's usage, a page at a time, following `next` to the end. */
  async *usagePages(customer: string, options: PageOptions = {}): AsyncGenerator<UsagePage> {
    let after: string | undefined;
    do {
      const { data, error, response } = await this.api.GET("/v1/accounts/{source}/{customer}/usage", {
        params: {
          path: this.where(customer, options),
          query: { ...this.query(options), period: options.period, limit: options.limit, after },
        },
        signal: options.signal,
      });
      const page = answer(data, error, response);
      yield page;
      after = page.next ?? undefined;
    } while (after !== undefined);
  }

  /** Every debit of the period, oldest first, across pages. */
  async *usage(customer: string, options: PageOptions = {}): AsyncGenerator<Usage> {
    for await (const page of this.usagePages(customer, options)) yield* page.usage;
  }

  /** The account's event log in provider order, a page at a time. */
  async *eventPages(customer: string, options: Omit<PageOptions, "period"> = {}): AsyncGenerator<AccountEvents> {
    let after: string | undefined;
    do {
      const { data, error, response } = await this.api.GET("/v1/accounts/{source}/{customer}/events", {
        params: { path: this.where(customer, options), query: { ...this.query(options), limit: options.limit, after } },
        signal: options.signal,
      });
      const page = answer(data, error, response);
      yield page;
      after = page.next ?? undefined;
    } while (after !== undefined);
  }

  /** Every event of the account's log, across pages. */
  async *events(customer: string, options: Omit<PageOptions, "period"> = {}): AsyncGenerator<AccountEvent> {
    for await (const page of this.eventPages(customer, options)) yield* page.events;
  }
}

/** No answer becomes the one error too: `timeout` when the signal ran out, else `unreachable`. */
function wrapTransport(inner: (request: Request) => Promise<Response>) {
  return async (request: Request): Promise<Response> => {
    try {
      return await inner(request);
    } catch (cause) {
      const timedOut = request.signal.aborted;
      const detail = timedOut ? "no answer in time" : `no answer: ${(cause as Error)?.message ?? cause}`;
      throw new BillingInboxError(0, timedOut ? "timeout" : "unreachable", detail, undefined);
    }
  };
}

function answer<T>(data: T | undefined, error: unknown, response: Response): T {
  if (response.ok && data !== undefined) return data;
  const body = (error ?? {}) as { code?: unknown; detail?: unknown };
  const code = typeof body.code === "string" ? body.code : `http_${response.status}`;
  const detail = typeof body.detail === "string" ? body.detail : response.statusText;
  const after = retryAfterMs(response.headers.get("retry-after"));
  throw new BillingInboxError(response.status, code, detail, error, after === undefined ? undefined : after / 1000);
}
