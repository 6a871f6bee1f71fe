-- The customer sweep (docs/design.md §6.1) goes on past a customer whose read fails; the
-- failures are counted here across runs, so that a customer that keeps failing is tried a
-- bounded number of runs and then skipped (and reported) instead of read forever.
CREATE TABLE reconcile_failures (
    source         text        NOT NULL,
    customer_key   text        NOT NULL,
    failures       integer     NOT NULL,
    last_error     text        NOT NULL,
    last_failed_at timestamptz NOT NULL DEFAULT inbox_now(),
    PRIMARY KEY (source, customer_key)
);

-- What a run could not read: reads that failed, and customers skipped for failing too often.
ALTER TABLE reconcile_runs
    ADD COLUMN failed_reads integer NOT NULL DEFAULT 0,
    ADD COLUMN skipped      integer NOT NULL DEFAULT 0;
