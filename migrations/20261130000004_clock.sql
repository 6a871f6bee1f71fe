-- One clock for every statement (docs/design.md §3.12): inbox_now() is now(), moved by the
-- session setting inbox.clock_offset_secs when one is set. Production never sets it; the
-- simulator does, so that lease expiry, retry waits and retention run on a clock it moves.
CREATE FUNCTION inbox_now() RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + make_interval(secs => COALESCE(
        NULLIF(current_setting('inbox.clock_offset_secs', true), '')::float8, 0))
$$;

ALTER TABLE inbox_events      ALTER COLUMN received_at SET DEFAULT inbox_now();
ALTER TABLE deliveries        ALTER COLUMN received_at SET DEFAULT inbox_now();
ALTER TABLE accounts          ALTER COLUMN created_at  SET DEFAULT inbox_now();
ALTER TABLE ledger            ALTER COLUMN created_at  SET DEFAULT inbox_now();
ALTER TABLE account_log       ALTER COLUMN logged_at   SET DEFAULT inbox_now();
ALTER TABLE reconcile_cursors ALTER COLUMN updated_at  SET DEFAULT inbox_now();
ALTER TABLE reconcile_runs    ALTER COLUMN started_at  SET DEFAULT inbox_now();
