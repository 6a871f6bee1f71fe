/** Retries of 503 and 429, honouring Retry-After: the same request (its Idempotency-Key included) is sent again. */

export interface RetryPolicy {
  /** Attempts after the first; 0 sends once. */
  retries: number;
  /** The first backoff, doubled after each attempt, when the answer names no Retry-After. */
  baseDelayMs: number;
  /** No wait is longer than this, a Retry-After's included. */
  maxDelayMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = { retries: 3, baseDelayMs: 200, maxDelayMs: 20_000 };

const RETRIED = new Set([429, 503]);

/** Retry-After as milliseconds: delay-seconds or an HTTP date (RFC 9110 §10.2.3). */
export function retryAfterMs(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

/** How long to wait before attempt `attempt` (1 = the first retry). */
export function backoffMs(policy: RetryPolicy, attempt: number, retryAfter: number | undefined): number {
  const backoff = policy.baseDelayMs * 2 ** (attempt - 1);
  // a little jitter, so clients told the same Retry-After do not come back together
  const wait = retryAfter ?? backoff + Math.random() * policy.baseDelayMs;
  return Math.min(wait, policy.maxDelayMs);
}

function sleep(ms: number, signal: AbortSignal | null): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(done, ms);
    function done() {
      signal?.removeEventListener("abort", aborted);
      resolve();
    }
    function aborted() {
      clearTimeout(timer);
      reject(signal?.reason);
    }
    signal?.addEventListener("abort", aborted, { once: true });
  });
}

/** A fetch that sends a request again on 503 or 429, waiting as the answer asks. */
export function retryingFetch(policy: RetryPolicy, base: typeof fetch = fetch): (request: Request) => Promise<Response> {
  return async (request: Request) => {
    for (let attempt = 0; ; attempt++) {
      const response = await base(request.clone());
      if (!RETRIED.has(response.status) || attempt >= policy.retries) return response;
      const wait = backoffMs(policy, attempt + 1, retryAfterMs(response.headers.get("retry-after")));
      await response.body?.cancel();
      await sleep(wait, request.signal);
    }
  };
}
