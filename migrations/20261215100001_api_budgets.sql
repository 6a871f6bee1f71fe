-- One budget of provider API calls per source, shared by every function instance
-- (docs/design.md §6.6): a token bucket, taken by one statement per call. `tokens` is what was
-- left at `refilled_at`; a take adds what the source's rate refilled since, up to its burst,
-- and takes one if the caller's lane may. `held_until` is the provider's own word: after a
-- 429 nothing is sent to it before then (its `Retry-After`), by any instance.
CREATE TABLE api_budgets (
    source      text             PRIMARY KEY,
    tokens      double precision NOT NULL,
    refilled_at timestamptz      NOT NULL DEFAULT inbox_now(),
    held_until  timestamptz,
    -- Calls taken and calls refused for the rate, since the row was made (what operators and
    -- the bench read).
    taken       bigint           NOT NULL DEFAULT 0,
    refused     bigint           NOT NULL DEFAULT 0
);
