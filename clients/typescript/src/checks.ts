/**
 * Checks that degrade safely: the feature check and the account read with a latency cap and a
 * last-known-good cache. On no answer in time, or a 5xx / 429, the answer comes from the cache
 * (stale: true, as_of: when it was read) if it is no older than the staleness allowed; without
 * such an entry a feature is refused (fail closed) unless the caller chose open, and an account
 * read throws. A 4xx is an answer, never hidden by the cache.
 */
import { readFile, rename, writeFile } from "node:fs/promises";
import { BillingInbox, type Account, type CallOptions, type FeatureCheck } from "./client.js";
import { BillingInboxError } from "./errors.js";

export interface CacheEntry {
  value: unknown;
  /** When the API gave it (ISO 8601). */
  at: string;
}

export interface CheckCache {
  get(key: string): Promise<CacheEntry | undefined>;
  set(key: string, entry: CacheEntry): Promise<void>;
}

export class MemoryCheckCache implements CheckCache {
  private readonly entries = new Map<string, CacheEntry>();
  async get(key: string) {
    return this.entries.get(key);
  }
  async set(key: string, entry: CacheEntry) {
    this.entries.set(key, entry);
  }
}

/** A cache kept in one JSON file, so that a process started while the API is down still has its last answers. */
export class FileCheckCache implements CheckCache {
  constructor(private readonly path: string) {}

  private async all(): Promise<Record<string, CacheEntry>> {
    try {
      return JSON.parse(await readFile(this.path, "utf8")) as Record<string, CacheEntry>;
    } catch {
      return {};
    }
  }

  async get(key: string) {
    return (await this.all())[key];
  }

  async set(key: string, entry: CacheEntry) {
    const all = await this.all();
    all[key] = entry;
    await writeFile(`${this.path}.new`, JSON.stringify(all));
    await rename(`${this.path}.new`, this.path);
  }
}

export interface GuardOptions {
  /** The latency cap of one check, retries included; 500 ms by default. */
  timeoutMs?: number;
  /** How old a cached answer may be and still be given; 15 minutes by default. */
  maxStalenessMs?: number;
  /** Without a cached answer, allow the feature (true) rather than refuse it (false, the default). */
  failOpen?: boolean;
  cache?: CheckCache;
  /** Milliseconds since the epoch, for tests. */
  now?: () => number;
}

/** Whether the answer is the API's now (stale false) or the cache's, and as of when; as_of null when neither had one. */
export interface Freshness {
  stale: boolean;
  as_of: string | null;
}

export class GuardedChecks {
  private readonly timeoutMs: number;
  private readonly maxStalenessMs: number;
  private readonly failOpen: boolean;
  private readonly cache: CheckCache;
  private readonly now: () => number;

  constructor(
    private readonly client: BillingInbox,
    options: GuardOptions = {},
  ) {
    this.timeoutMs = options.timeoutMs ?? 500;
    this.maxStalenessMs = options.maxStalenessMs ?? 15 * 60_000;
    this.failOpen = options.failOpen ?? false;
    this.cache = options.cache ?? new MemoryCheckCache();
    this.now = options.now ?? Date.now;
  }

  async feature(customer: string, key: string, options: CallOptions = {}): Promise<FeatureCheck & Freshness> {
    const cacheKey = `${this.client.sourceOf(options)}/${customer}/feature/${key}`;
    const cached = await this.guarded(cacheKey, (signal) => this.client.feature(customer, key, { ...options, signal }));
    if (cached) return cached as FeatureCheck & Freshness;
    // Nothing seen: never grant what was not seen granted, unless the caller chose open.
    return { key, allowed: this.failOpen, value: null, source: null, decided_by: null, stale: true, as_of: null };
  }

  async account(customer: string, options: CallOptions & { period?: string } = {}): Promise<Account & Freshness> {
    const cacheKey = `${this.client.sourceOf(options)}/${customer}/account/${options.period ?? ""}`;
    const answer = await this.guarded(cacheKey, (signal) => this.client.account(customer, { ...options, signal }), true);
    return answer as Account & Freshness;
  }

  /** The API's answer (cached), else the cache's when the API is unavailable; undefined (or the error, with `rethrow`) when the cache has none fresh enough. */
  private async guarded<T extends object>(
    cacheKey: string,
    call: (signal: AbortSignal) => Promise<T>,
    rethrow = false,
  ): Promise<(T & Freshness) | undefined> {
    try {
      const value = await call(AbortSignal.timeout(this.timeoutMs));
      const at = new Date(this.now()).toISOString();
      await this.cache.set(cacheKey, { value, at });
      return { ...value, stale: false, as_of: at };
    } catch (error) {
      if (!(error instanceof BillingInboxError) || !(error.unavailable || error.status === 429)) throw error;
      const entry = await this.cache.get(cacheKey);
      if (entry && this.now() - Date.parse(entry.at) <= this.maxStalenessMs) {
        return { ...(entry.value as T), stale: true, as_of: entry.at };
      }
      if (rethrow) throw error;
      return undefined;
    }
  }
}
