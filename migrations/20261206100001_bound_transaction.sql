-- The worker's transactions end after 10 s idle (shared/src/apply.rs `begin`). On a direct
-- connection the worker says so with `SET LOCAL`; through a transaction-mode pooler it calls
-- this function instead (DATABASE_POOLER=transaction): RDS Proxy pins a session that runs a
-- SET, and does not look into the functions a statement calls. The setting is local to the
-- transaction (set_config's third argument), so nothing of it stays on the server connection.
CREATE FUNCTION inbox_bound_transaction() RETURNS void
LANGUAGE sql AS $$
    SELECT set_config('idle_in_transaction_session_timeout', '10s', true);
$$;
