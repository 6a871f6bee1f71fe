-- The events still to be worked on, or given up, in a narrow table of their own
-- (docs/design.md §3.3, §3.4): the event's row keeps no index whose key or predicate names a
-- column its life changes, so the claim, the finish, a failure and a copy's count are HOT
-- updates of the event's row (a new row version on the same page, no index entry, and in the
-- WAL only the bytes that changed); the partial indexes of the events in flight, given up,
-- leased, due and unalerted, each of which took an entry at every status change, are gone. An
-- event has a row in `inbox_work` from its store until it is `applied` or `ignored` (again
-- after a replay): written by the triggers below, in the statement that changes the event, so
-- every writer of `inbox_events` (the intake, the worker, the rescue, a replay, the drop of a
-- month, an operator's own SQL) keeps it exact, and only when the event enters or leaves
-- that set, is given up, or alerted on: the claim and the retries of an event in flight do
-- not touch it.

-- What an event's status makes of it here: `pending` (received, processing, failed), `dead`
-- or `unprocessable` (given up), nothing once it is applied or ignored.
CREATE FUNCTION inbox_stage(status text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN status IN ('received', 'processing', 'failed') THEN 'pending'
                WHEN status IN ('dead', 'unprocessable') THEN status END
    $$;

CREATE TABLE inbox_work (
    event_id bigint NOT NULL,
    month date NOT NULL,
    source text NOT NULL,
    customer_key text,
    stage text NOT NULL CHECK (stage IN ('pending', 'dead', 'unprocessable')),
    -- `alerted_at` set on the event (a given-up event reported once, docs/design.md §3.8).
    alerted boolean NOT NULL,
    PRIMARY KEY (event_id, month)
);
-- The rescue, the bury and the backlog read the events of a stage (`pending`, `dead`); the
-- alerts those given up and not reported yet; the account's view its events in flight and
-- given up.
CREATE INDEX inbox_work_stage ON inbox_work (stage, event_id);
CREATE INDEX inbox_work_unalerted ON inbox_work (event_id) WHERE stage <> 'pending' AND NOT alerted;
CREATE INDEX inbox_work_customer ON inbox_work (source, customer_key);

-- Keeps the event's `inbox_work` row as its status says: written when the event is stored
-- (unless finished already), when its stage changes, when it is alerted on or its customer
-- set; removed when it is finished or deleted.
CREATE FUNCTION inbox_work_follow() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' OR inbox_stage(NEW.status) IS NULL THEN
        DELETE FROM inbox_work WHERE event_id = OLD.id AND month = OLD.month;
        RETURN NULL;
    END IF;
    INSERT INTO inbox_work AS w (event_id, month, source, customer_key, stage, alerted)
    VALUES (NEW.id, NEW.month, NEW.source, NEW.customer_key, inbox_stage(NEW.status),
            NEW.alerted_at IS NOT NULL)
    ON CONFLICT (event_id, month) DO UPDATE
    SET source = EXCLUDED.source, customer_key = EXCLUDED.customer_key, stage = EXCLUDED.stage,
        alerted = EXCLUDED.alerted;
    RETURN NULL;
END $$;

CREATE TRIGGER inbox_work_stored AFTER INSERT ON inbox_events FOR EACH ROW
    WHEN (inbox_stage(NEW.status) IS NOT NULL)
    EXECUTE FUNCTION inbox_work_follow();
CREATE TRIGGER inbox_work_moved AFTER UPDATE OF status, alerted_at, customer_key ON inbox_events
    FOR EACH ROW
    WHEN (inbox_stage(OLD.status) IS DISTINCT FROM inbox_stage(NEW.status)
          OR (OLD.alerted_at IS NULL) <> (NEW.alerted_at IS NULL)
          OR OLD.customer_key IS DISTINCT FROM NEW.customer_key)
    EXECUTE FUNCTION inbox_work_follow();
CREATE TRIGGER inbox_work_removed AFTER DELETE ON inbox_events FOR EACH ROW
    WHEN (inbox_stage(OLD.status) IS NOT NULL)
    EXECUTE FUNCTION inbox_work_follow();

-- The events stored before: one row each that is not finished.
INSERT INTO inbox_work (event_id, month, source, customer_key, stage, alerted)
SELECT id, month, source, customer_key, inbox_stage(status), alerted_at IS NOT NULL
FROM inbox_events
WHERE inbox_stage(status) IS NOT NULL;

-- Every index of the event's row that named a changing column, in its key or its predicate.
DROP INDEX inbox_events_failed_due, inbox_events_finished, inbox_events_given_up,
    inbox_events_not_enqueued, inbox_events_pending, inbox_events_processing_lease,
    inbox_events_unalerted;
-- The purge by rows reads the kept partition alone (the months go whole): its finished events
-- by age, there only, so that a status change in a month's partition stays HOT.
CREATE INDEX inbox_events_kept_finished ON inbox_events_kept (received_at)
    WHERE status IN ('applied', 'ignored');

-- Room on each page for the row's next versions: the claim's and the finish's (a row of about
-- 400 bytes, its bodies out of line), which HOT puts on the row's own page or not at all. New
-- pages only; the months to come are made with it.
DO $$
DECLARE
    p regclass;
BEGIN
    FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'inbox_events'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 75)', p);
    END LOOP;
END $$;

-- As in 20270101500001, each month's events made with the fillfactor above.
CREATE OR REPLACE FUNCTION inbox_make_months(first date, months integer) RETURNS bigint
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
                        WITH (toast_tuple_target = 512, fillfactor = 75)',
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

-- As it was (20270101500001), the account's events in flight and given up read from their
-- rows here.
CREATE OR REPLACE VIEW account_events AS
SELECT l.source, l.customer_id, l.event_id, l.event_type, l.occurred_at, l.outcome, l.reason
FROM account_log l
UNION ALL
SELECT w.source, w.customer_key, e.id, e.type, e.occurred_at, NULL, e.reason
FROM inbox_work w
JOIN inbox_events e ON e.id = w.event_id AND e.month = w.month
WHERE w.customer_key IS NOT NULL
  AND e.dedupe_key NOT LIKE 'read:%'
  AND NOT EXISTS (SELECT 1 FROM account_log l WHERE l.event_id = e.id);
