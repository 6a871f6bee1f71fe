/** The one error the client throws: the API's `{code, detail}`, or the client's own for a request that got no answer. */
export class BillingInboxError extends Error {
  /** The HTTP status; 0 when no answer came (`code` is then `timeout` or `unreachable`). */
  readonly status: number;
  /** Stable, for programs: the API's code (docs/api.md, Errors), or `timeout` / `unreachable`. */
  readonly code: string;
  /** For people. */
  readonly detail: string;
  /** The answer's whole body (409 allowance_exhausted carries `remaining`). */
  readonly body: unknown;
  /** Seconds, from the answer's Retry-After, when it had one. */
  readonly retryAfter: number | undefined;

  constructor(status: number, code: string, detail: string, body?: unknown, retryAfter?: number) {
    super(`${code}: ${detail}`);
    this.name = "BillingInboxError";
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.body = body;
    this.retryAfter = retryAfter;
  }

  /** No answer, or an answer that says the state could not be reached: a degraded check may answer from its cache. */
  get unavailable(): boolean {
    return this.status === 0 || this.status >= 500;
  }
}
