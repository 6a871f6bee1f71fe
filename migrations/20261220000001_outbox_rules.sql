-- The rules an outbox row's life shares, written once for `effects` and `meter_reports`
-- (docs/design.md §11.2): each table's statements name their own table and ask these. Each is
-- one plain SQL expression, so the planner inlines it and every statement reads the indexes
-- it read before.

-- A pending row that no dispatcher holds and no retry wait holds back: it may be taken now.
CREATE FUNCTION outbox_free(locked_until timestamptz, next_attempt_at timestamptz)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT (locked_until IS NULL OR locked_until < inbox_now())
       AND (next_attempt_at IS NULL OR next_attempt_at <= inbox_now())
$$;

-- A free row whose message the queue lost: never enqueued (the send failed), enqueued more
-- than `stuck_secs` ago (the message was lost), or not enqueued since its retry became due or
-- its hold expired.
CREATE FUNCTION outbox_lost(locked_until timestamptz, next_attempt_at timestamptz,
                            enqueued_at timestamptz, stuck_secs float8)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT outbox_free(locked_until, next_attempt_at)
       AND (enqueued_at IS NULL
            OR enqueued_at < inbox_now() - make_interval(secs => stuck_secs)
            OR enqueued_at < next_attempt_at
            OR enqueued_at < locked_until)
$$;
