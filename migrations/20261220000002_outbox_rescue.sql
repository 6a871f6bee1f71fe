-- The rescue's two statements, written once for every outbox table (`effects`,
-- `meter_reports`; docs/design.md §3.13), as pgmq writes one `read` for every queue: the table
-- is an argument, checked against the outboxes, and each statement is the same for both.

-- Buries the pending rows whose last attempt's hold expired: the dispatcher stopped during
-- it, and no attempt is left. Returns how many.
CREATE FUNCTION outbox_bury(outbox regclass, max_attempts int)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    buried bigint;
BEGIN
    IF outbox NOT IN ('effects'::regclass, 'meter_reports'::regclass) THEN
        RAISE EXCEPTION 'outbox_bury: % is not an outbox', outbox;
    END IF;
    EXECUTE format(
        'UPDATE %s
         SET status = ''dead'', locked_until = NULL, next_attempt_at = NULL,
             last_error = COALESCE(last_error || ''; '', '''')
                          || ''the dispatcher stopped during the last attempt (hold expired)''
         WHERE status = ''pending'' AND locked_until < inbox_now() AND attempts >= $1',
        outbox) USING max_attempts;
    GET DIAGNOSTICS buried = ROW_COUNT;
    RETURN buried;
END
$$;

-- Marks (and returns) at most `rows_per_step` pending rows the queue lost (`outbox_lost`),
-- oldest first, each marked in the statement that picks it (`SKIP LOCKED`), so two
-- overlapping rescues never send one row twice.
CREATE FUNCTION outbox_mark(outbox regclass, rows_per_step bigint, stuck_secs float8)
RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    IF outbox NOT IN ('effects'::regclass, 'meter_reports'::regclass) THEN
        RAISE EXCEPTION 'outbox_mark: % is not an outbox', outbox;
    END IF;
    RETURN QUERY EXECUTE format(
        'UPDATE %1$s SET enqueued_at = inbox_now()
         WHERE id IN (
             SELECT id FROM %1$s
             WHERE status = ''pending''
               AND outbox_lost(locked_until, next_attempt_at, enqueued_at, $2)
             ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED
         )
         RETURNING id',
        outbox) USING rows_per_step, stuck_secs;
END
$$;
