-- Effects: what changed, told to the app once (docs/design.md §11). The worker writes one
-- row per change that took effect, in the transaction that made the change; the dispatcher
-- delivers it after the commit, to every configured sink, at least once.

-- Each account numbers its effects, so an app can tell a newer change from an older one.
ALTER TABLE accounts ADD COLUMN effect_seq bigint NOT NULL DEFAULT 0;

CREATE TABLE effects (
    -- 'eff_' and 32 hex digits of SHA-256 over the kind and the cause: the same change
    -- always has the same id, so a copy, a replay or a retried transaction cannot add one.
    id              text        PRIMARY KEY,
    kind            text        NOT NULL,
    -- What the effect reflects, in words an operator can read: a register and the event
    -- version that moved it, or a ledger entry.
    cause           text        NOT NULL,
    source          text        NOT NULL,
    customer_id     text        NOT NULL,
    sequence        bigint      NOT NULL,
    -- The causing event (no foreign key: finished events are purged, effects are kept).
    event_id        bigint      NOT NULL,
    -- The provider's time of the causing event.
    occurred_at     timestamptz NOT NULL,
    -- The webhook body exactly as every sink receives it: {"id","type","occurred_at","data"}.
    body            jsonb       NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'sent', 'dead')),
    -- The sinks that have acknowledged it; the effect is sent when every sink has.
    sent_to         text[]      NOT NULL DEFAULT '{}',
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz,
    -- A dispatcher holds the effect until then; another one takes it only after.
    locked_until    timestamptz,
    enqueued_at     timestamptz,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT inbox_now(),
    sent_at         timestamptz,
    alerted_at      timestamptz,
    FOREIGN KEY (source, customer_id) REFERENCES accounts (source, customer_id)
);

-- Rescue: pending effects by age (the queue lost the message, or a retry is due).
CREATE INDEX effects_pending ON effects (created_at) WHERE status = 'pending';
-- Operators: by status and age; an account's effects in order.
CREATE INDEX effects_status_created ON effects (status, created_at);
CREATE INDEX effects_account ON effects (source, customer_id, sequence);
