-- Events and deliveries stored by the provider's month (docs/design.md §3.14): the purge drops a
-- month at once instead of deleting its rows one by one, each a dead tuple and an index entry
-- to vacuum. `month` is the UTC month of the event's provider time (the intake's time for an
-- event with no trusted one); every copy of an event carries its original's provider time, so
-- it falls into its original's month and the unique key `(dedupe_key, source, month)`, which
-- Postgres requires to hold the partition key, is as strict as `(dedupe_key, source)` was.
--
-- The tables are rebuilt: a partitioned table cannot be made from a plain one in place. Every
-- row is copied under its own id, which costs a rewrite of both tables and their indexes (and
-- as much WAL) under a lock that stops the intake meanwhile; docs/design.md §3.14 says what
-- that is on a large store.

-- The month an event is stored under. Immutable (a fixed time zone), so that an index or a
-- check may use it.
CREATE FUNCTION inbox_month(at timestamptz) RETURNS date
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT date_trunc('month', at AT TIME ZONE 'UTC')::date $$;

DROP VIEW account_events;
ALTER TABLE deliveries DROP CONSTRAINT deliveries_event_id_fkey;
-- A health notice's sweep is removed with its notice by the purge itself (both ways it runs),
-- since a key to a partitioned table must name the month.
ALTER TABLE health_sweeps DROP CONSTRAINT health_sweeps_event_id_fkey;
DROP TRIGGER audit_points_inserted ON inbox_events;
DROP TRIGGER audit_points_updated ON inbox_events;
DROP TRIGGER audit_points_deleted ON inbox_events;

ALTER TABLE inbox_events RENAME TO inbox_events_unpartitioned;
ALTER TABLE deliveries RENAME TO deliveries_unpartitioned;
-- The old tables' keys and indexes give their names to the new ones; the old rows are read
-- once, whole, so they need none but the primary keys.
ALTER TABLE inbox_events_unpartitioned DROP CONSTRAINT inbox_events_source_dedupe_key;
ALTER INDEX inbox_events_pkey RENAME TO inbox_events_unpartitioned_pkey;
ALTER INDEX deliveries_pkey RENAME TO deliveries_unpartitioned_pkey;
DROP INDEX inbox_events_customer, inbox_events_failed_due, inbox_events_finished,
    inbox_events_given_up, inbox_events_not_enqueued, inbox_events_pending,
    inbox_events_processing_lease, inbox_events_source_received, inbox_events_unalerted,
    deliveries_conflicts, deliveries_event_first, deliveries_received,
    deliveries_unalerted_conflicts;

-- A row inserted without its month (hand-written SQL; the intake always names it) takes the
-- month it arrived in, the rule of an event with no trusted time.
CREATE TABLE inbox_events (
    LIKE inbox_events_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY,
    month date NOT NULL DEFAULT inbox_month(inbox_now())
) PARTITION BY RANGE (month);
ALTER TABLE inbox_events ADD PRIMARY KEY (id, month);
ALTER TABLE inbox_events
    ADD CONSTRAINT inbox_events_source_dedupe_key UNIQUE (dedupe_key, source, month);

-- A delivery is stored in its event's month, so that it goes with its event.
CREATE TABLE deliveries (
    LIKE deliveries_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY,
    month date NOT NULL
) PARTITION BY RANGE (month);
ALTER TABLE deliveries ADD PRIMARY KEY (id, month);
ALTER TABLE deliveries ADD CONSTRAINT deliveries_event_fkey FOREIGN KEY (event_id, month)
    REFERENCES inbox_events (id, month) ON DELETE CASCADE;

-- Every row of a month with no partition: the months older than the oldest partition (what the
-- purge of a month kept, a copy of an event whose month is gone) and, only if the scheduler
-- stopped, a month it did not make in time. Purged by rows (docs/design.md §3.9).
CREATE TABLE inbox_events_kept PARTITION OF inbox_events DEFAULT WITH (toast_tuple_target = 512);
CREATE TABLE deliveries_kept PARTITION OF deliveries DEFAULT;

-- The indexes as they were, each now one per partition.
CREATE INDEX inbox_events_customer ON inbox_events (source, customer_key, occurred_at);
CREATE INDEX inbox_events_failed_due ON inbox_events (next_attempt_at) WHERE status = 'failed';
CREATE INDEX inbox_events_finished ON inbox_events (received_at)
    WHERE status IN ('applied', 'ignored');
CREATE INDEX inbox_events_given_up ON inbox_events (source, customer_key)
    WHERE status IN ('dead', 'unprocessable');
CREATE INDEX inbox_events_not_enqueued ON inbox_events (received_at)
    WHERE status = 'received' AND enqueued_at IS NULL;
CREATE INDEX inbox_events_pending ON inbox_events (source, customer_key)
    WHERE status IN ('received', 'processing', 'failed');
CREATE INDEX inbox_events_processing_lease ON inbox_events (locked_until)
    WHERE status = 'processing';
CREATE INDEX inbox_events_source_received ON inbox_events (source, received_at);
CREATE INDEX inbox_events_unalerted ON inbox_events (id)
    WHERE status IN ('dead', 'unprocessable') AND alerted_at IS NULL;
CREATE INDEX deliveries_conflicts ON deliveries (received_at) WHERE verdict = 'conflict';
CREATE INDEX deliveries_event_first ON deliveries (event_id, id);
CREATE INDEX deliveries_received ON deliveries (received_at);
CREATE INDEX deliveries_unalerted_conflicts ON deliveries (id)
    WHERE verdict = 'conflict' AND alerted_at IS NULL;

-- Names a partition's indexes after the table's, with the partition's `suffix`
-- (`inbox_events_pending_2027_01`), so that a plan says which index it reads; Postgres would
-- name them by their columns, alike for two partial indexes on the same columns.
CREATE FUNCTION inbox_name_indexes(partition regclass, suffix text) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.relname AS child, p.relname AS parent
        FROM pg_index x
        JOIN pg_class c ON c.oid = x.indexrelid
        JOIN pg_inherits i ON i.inhrelid = x.indexrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE x.indrelid = partition
    LOOP
        EXECUTE format('ALTER INDEX %I RENAME TO %I', r.child, r.parent || '_' || suffix);
    END LOOP;
END $$;
SELECT inbox_name_indexes('inbox_events_kept', 'kept');
SELECT inbox_name_indexes('deliveries_kept', 'kept');

-- Whether a stored event is named by what the fold of an account needs (docs/design.md §3.9):
-- a register, a grant, a payment intent's halves, a credit grant or transaction, a tombstone.
-- One probe each; the purge by rows and the drop of a month both ask it. A plain expression,
-- which the planner inlines.
CREATE FUNCTION inbox_event_named(event bigint) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT EXISTS (SELECT 1 FROM customer_plans r WHERE r.event_id = event)
        OR EXISTS (SELECT 1 FROM customer_standing r WHERE r.event_id = event)
        OR EXISTS (SELECT 1 FROM subscriptions r WHERE r.event_id = event)
        OR EXISTS (SELECT 1 FROM payments r WHERE r.event_id = event)
        OR EXISTS (SELECT 1 FROM ledger r WHERE r.event_id = event)
        OR EXISTS (SELECT 1 FROM entitlements r WHERE r.event_id = event)
        OR EXISTS (SELECT 1 FROM payment_intents r
                   WHERE r.linked_by = event OR r.refunded_by = event)
        OR EXISTS (SELECT 1 FROM accounts r WHERE r.deleted_by = event)
        OR EXISTS (SELECT 1 FROM credit_grants r WHERE r.event_id = event)
        OR EXISTS (SELECT 1 FROM credit_grants r WHERE r.voided_by = event)
        OR EXISTS (SELECT 1 FROM credit_transactions r WHERE r.event_id = event)
    $$;

-- The months that have partitions of their own, oldest first.
CREATE FUNCTION inbox_months() RETURNS SETOF date
    LANGUAGE sql STABLE
    AS $$
    SELECT to_date(substr(c.relname, length('inbox_events_') + 1), 'YYYY_MM')
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'inbox_events'::regclass AND c.relname <> 'inbox_events_kept'
    ORDER BY 1
    $$;

-- Makes sure the partitions of `months` months from `first` on exist, for events and
-- deliveries alike, and returns how many events it moved: the rows of a month that had no
-- partition, which the kept partitions held (a partition cannot be made over rows the default
-- holds in its range). Moved under their own ids, with their deliveries. One run at a time.
CREATE FUNCTION inbox_make_months(first date, months integer) RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    m date;
    moving_events inbox_events[];
    moving_deliveries deliveries[];
    moved bigint := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('inbox_events months'));
    FOR i IN 0 .. months - 1 LOOP
        m := (date_trunc('month', first) + make_interval(months => i))::date;
        CONTINUE WHEN to_regclass('inbox_events_' || to_char(m, 'YYYY_MM')) IS NOT NULL;
        -- The month has no partition: its rows, if any, are in the kept ones.
        SELECT array_agg(e) INTO moving_events FROM inbox_events e WHERE e.month = m;
        IF moving_events IS NOT NULL THEN
            SELECT array_agg(d) INTO moving_deliveries FROM deliveries d WHERE d.month = m;
            DELETE FROM deliveries WHERE month = m;
            DELETE FROM inbox_events WHERE month = m;
        END IF;
        EXECUTE format('CREATE TABLE %I PARTITION OF inbox_events FOR VALUES FROM (%L) TO (%L)
                        WITH (toast_tuple_target = 512)',
                       'inbox_events_' || to_char(m, 'YYYY_MM'), m, m + interval '1 month');
        EXECUTE format('CREATE TABLE %I PARTITION OF deliveries FOR VALUES FROM (%L) TO (%L)',
                       'deliveries_' || to_char(m, 'YYYY_MM'), m, m + interval '1 month');
        PERFORM inbox_name_indexes(('inbox_events_' || to_char(m, 'YYYY_MM'))::regclass,
                                   to_char(m, 'YYYY_MM'));
        PERFORM inbox_name_indexes(('deliveries_' || to_char(m, 'YYYY_MM'))::regclass,
                                   to_char(m, 'YYYY_MM'));
        IF moving_events IS NOT NULL THEN
            INSERT INTO inbox_events OVERRIDING SYSTEM VALUE SELECT * FROM unnest(moving_events);
            INSERT INTO deliveries OVERRIDING SYSTEM VALUE
                SELECT * FROM unnest(moving_deliveries);
            moved := moved + cardinality(moving_events);
        END IF;
    END LOOP;
    RETURN moved;
END $$;

-- Drops the month `m` (docs/design.md §3.9, §3.14): its partitions are detached, the events
-- the purge's rules keep are inserted back under their own ids with their first delivery (the
-- fold's `via`) — with no partition for their month they land in `inbox_events_kept` — and the
-- rest goes with the tables. Kept: every event not applied or ignored, every event
-- `inbox_event_named`, and every read made for an event still stored (in another month, or
-- kept here). The audit's checked points of the accounts whose finished events went move, as a
-- deleted row moves them. Returns the events dropped and kept; nothing when the month has no
-- partition. One run at a time.
CREATE FUNCTION inbox_drop_month(m date, OUT dropped bigint, OUT kept bigint)
    LANGUAGE plpgsql AS $$
DECLARE
    events text := 'inbox_events_' || to_char(m, 'YYYY_MM');
    deliveries text := 'deliveries_' || to_char(m, 'YYYY_MM');
    kept_ids bigint[];
BEGIN
    dropped := 0;
    kept := 0;
    PERFORM pg_advisory_xact_lock(hashtext('inbox_events months'));
    IF to_regclass(events) IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('ALTER TABLE deliveries DETACH PARTITION %I', deliveries);
    -- The detached table keeps its own copy of the key to the events; it would hold the
    -- events' detach to its rows.
    EXECUTE format('ALTER TABLE %I DROP CONSTRAINT deliveries_event_fkey', deliveries);
    EXECUTE format('ALTER TABLE inbox_events DETACH PARTITION %I', events);
    -- What the purge keeps; `inbox_events` no longer holds the month, so a read whose event
    -- it finds was made for an event of another month.
    EXECUTE format(
        'WITH RECURSIVE kept AS (
             SELECT e.id FROM %1$I e
             WHERE e.status NOT IN (''applied'', ''ignored'')
                OR inbox_event_named(e.id)
                OR EXISTS (SELECT 1 FROM inbox_events o WHERE o.id = e.made_for)
             UNION
             SELECT e.id FROM %1$I e JOIN kept k ON e.made_for = k.id
         )
         SELECT COALESCE(array_agg(id), ''{}'') FROM kept', events) INTO kept_ids;
    EXECUTE format(
        'INSERT INTO inbox_events OVERRIDING SYSTEM VALUE
         SELECT e.* FROM %I e WHERE e.id = ANY($1)', events) USING kept_ids;
    GET DIAGNOSTICS kept = ROW_COUNT;
    EXECUTE format(
        'INSERT INTO deliveries OVERRIDING SYSTEM VALUE
         SELECT DISTINCT ON (d.event_id) d.* FROM %I d
         WHERE d.event_id = ANY($1)
         ORDER BY d.event_id, d.id', deliveries) USING kept_ids;
    EXECUTE format(
        'UPDATE audit_points p
         SET moves = p.moves + 1,
             cut = CASE WHEN gone.earliest <= p.cut THEN NULL ELSE p.cut END,
             state = CASE WHEN gone.earliest <= p.cut THEN NULL ELSE p.state END
         FROM (SELECT e.source, e.customer_key, min(e.occurred_at) AS earliest FROM %I e
               WHERE e.customer_key IS NOT NULL
                 AND (e.status IN (''applied'', ''ignored'') OR e.dedupe_key LIKE ''read:%%'')
                 AND e.id <> ALL($1)
               GROUP BY e.source, e.customer_key) gone
         WHERE p.source = gone.source AND p.customer_id = gone.customer_key', events)
        USING kept_ids;
    EXECUTE format('SELECT count(*) - $1 FROM %I', events) INTO dropped USING kept;
    EXECUTE format('DROP TABLE %I, %I', events, deliveries);
    DELETE FROM health_sweeps s
    WHERE NOT EXISTS (SELECT 1 FROM inbox_events e WHERE e.id = s.event_id);
END $$;

-- This month and the next two, as each scheduler run makes them. The rows of older months
-- land in the kept partitions and are purged by rows, as before.
SELECT inbox_make_months(inbox_month(inbox_now()), 3);

INSERT INTO inbox_events OVERRIDING SYSTEM VALUE
SELECT e.*, inbox_month(COALESCE(e.occurred_at, e.received_at)) FROM inbox_events_unpartitioned e;
INSERT INTO deliveries OVERRIDING SYSTEM VALUE
SELECT d.*, e.month FROM deliveries_unpartitioned d JOIN inbox_events e ON e.id = d.event_id;
SELECT setval(pg_get_serial_sequence('inbox_events', 'id'),
              GREATEST((SELECT max(id) FROM inbox_events_unpartitioned), 1),
              (SELECT max(id) FROM inbox_events_unpartitioned) IS NOT NULL);
SELECT setval(pg_get_serial_sequence('deliveries', 'id'),
              GREATEST((SELECT max(id) FROM deliveries_unpartitioned), 1),
              (SELECT max(id) FROM deliveries_unpartitioned) IS NOT NULL);
DROP TABLE deliveries_unpartitioned;
DROP TABLE inbox_events_unpartitioned;
ALTER SEQUENCE inbox_events_id_seq1 RENAME TO inbox_events_id_seq;
ALTER SEQUENCE deliveries_id_seq1 RENAME TO deliveries_id_seq;

-- The audit's checked points move with the account's events, as before (20261212100002); made
-- after the copy, which changes no event.
CREATE TRIGGER audit_points_inserted AFTER INSERT ON inbox_events FOR EACH ROW
    WHEN (NEW.status IN ('applied', 'ignored') OR NEW.dedupe_key LIKE 'read:%')
    EXECUTE FUNCTION audit_points_moved();
CREATE TRIGGER audit_points_updated AFTER UPDATE ON inbox_events FOR EACH ROW
    WHEN ((OLD.status IN ('applied', 'ignored') OR NEW.status IN ('applied', 'ignored')
           OR NEW.dedupe_key LIKE 'read:%')
          AND (OLD.status IS DISTINCT FROM NEW.status OR OLD.settled IS DISTINCT FROM NEW.settled
               OR OLD.customer_key IS DISTINCT FROM NEW.customer_key
               OR OLD.occurred_at IS DISTINCT FROM NEW.occurred_at))
    EXECUTE FUNCTION audit_points_moved();
CREATE TRIGGER audit_points_deleted AFTER DELETE ON inbox_events FOR EACH ROW
    WHEN (OLD.status IN ('applied', 'ignored') OR OLD.dedupe_key LIKE 'read:%')
    EXECUTE FUNCTION audit_points_moved();

-- As it was (20261214130002), over the partitioned table.
CREATE VIEW account_events AS
SELECT l.source, l.customer_id, l.event_id, l.event_type, l.occurred_at, l.outcome, l.reason
FROM account_log l
UNION ALL
SELECT e.source, e.customer_key, e.id, e.type, e.occurred_at, NULL, e.reason
FROM inbox_events e
WHERE (e.status IN ('received', 'processing', 'failed') OR e.status IN ('dead', 'unprocessable'))
  AND e.customer_key IS NOT NULL
  AND e.dedupe_key NOT LIKE 'read:%'
  AND NOT EXISTS (SELECT 1 FROM account_log l WHERE l.event_id = e.id);
