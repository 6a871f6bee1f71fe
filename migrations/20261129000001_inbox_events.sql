-- The inbox: every verified event, stored once per (source, dedupe_key).
CREATE TABLE inbox_events (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source          text        NOT NULL,
    dedupe_key      text        NOT NULL,
    type            text        NOT NULL,
    -- The signed content as JSON (for Kinde, the verified JWT claims); NULL when it is not JSON.
    payload         jsonb,
    -- The body exactly as received, for re-verification and forensics.
    raw_body        bytea       NOT NULL,
    -- SHA-256 of the event's content without its delivery envelope: tells a copy from a conflict.
    payload_hash    bytea       NOT NULL CHECK (octet_length(payload_hash) = 32),
    customer_key    text,
    -- The provider's time for the event; the billing order. NULL only when unparseable.
    occurred_at     timestamptz,
    received_at     timestamptz NOT NULL DEFAULT now(),
    seen_count      integer     NOT NULL DEFAULT 1 CHECK (seen_count >= 1),
    status          text        NOT NULL DEFAULT 'received'
                    CHECK (status IN ('received', 'processing', 'applied', 'ignored', 'failed', 'dead', 'unprocessable')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz,
    locked_until    timestamptz,
    enqueued_at     timestamptz,
    processed_at    timestamptz,
    -- Why the event ended as it did, in words ("ignored: a newer plan change is already stored").
    reason          text,
    last_error      text,
    CONSTRAINT inbox_events_source_dedupe_key UNIQUE (source, dedupe_key)
);

-- Rescue sweep: stored but never handed to the queue.
CREATE INDEX inbox_events_not_enqueued ON inbox_events (received_at)
    WHERE status = 'received' AND enqueued_at IS NULL;
-- Retry sweep: failed rows by due time.
CREATE INDEX inbox_events_failed_due ON inbox_events (next_attempt_at)
    WHERE status = 'failed';
-- Lease sweep: rows whose worker may have died.
CREATE INDEX inbox_events_processing_lease ON inbox_events (locked_until)
    WHERE status = 'processing';
-- Operators and purge: by status and age.
CREATE INDEX inbox_events_status_received ON inbox_events (status, received_at);
-- An account's event log, in provider order.
CREATE INDEX inbox_events_customer ON inbox_events (source, customer_key, occurred_at);

-- One row per HTTP attempt that passed authentication.
CREATE TABLE deliveries (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     bigint      NOT NULL REFERENCES inbox_events (id) ON DELETE CASCADE,
    received_at  timestamptz NOT NULL DEFAULT now(),
    verdict      text        NOT NULL CHECK (verdict IN ('stored', 'duplicate', 'conflict')),
    -- The provider's own id for this delivery attempt or message (webhook-id), when it sends one.
    delivery_id  text,
    -- The signed send time of this attempt (Stripe's t, webhook-timestamp, Kinde's timestamp).
    sent_at      timestamptz,
    -- Hash of this delivery's content: differs from the event's on a conflict.
    payload_hash bytea       NOT NULL,
    -- The delivery headers that matter (user-agent, content-type, ids and times); never signatures.
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX deliveries_event ON deliveries (event_id);
CREATE INDEX deliveries_conflicts ON deliveries (received_at) WHERE verdict = 'conflict';
