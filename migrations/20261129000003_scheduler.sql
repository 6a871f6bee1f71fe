-- What the scheduler has already reported, so that each dead, unprocessable or conflicting
-- event raises its alert once.
ALTER TABLE inbox_events ADD COLUMN alerted_at timestamptz;
ALTER TABLE deliveries ADD COLUMN alerted_at timestamptz;

CREATE INDEX inbox_events_unalerted ON inbox_events (id)
    WHERE status IN ('dead', 'unprocessable') AND alerted_at IS NULL;
CREATE INDEX deliveries_unalerted_conflicts ON deliveries (id)
    WHERE verdict = 'conflict' AND alerted_at IS NULL;

-- Reconciliation with each provider's API: where the next read starts, and what each run saw.
CREATE TABLE reconcile_cursors (
    source      text        PRIMARY KEY,
    cursor_at   timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE reconcile_runs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source        text        NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    cursor_from   timestamptz,
    cursor_to     timestamptz,
    read          integer     NOT NULL DEFAULT 0,
    stored_new    integer     NOT NULL DEFAULT 0,
    discrepancies integer     NOT NULL DEFAULT 0,
    error         text
);
CREATE INDEX reconcile_runs_source ON reconcile_runs (source, started_at);
