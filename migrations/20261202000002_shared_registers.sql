-- Subscriptions and payments are keyed by their provider id, not by the account: an event of
-- another customer can write the same row, and the account's version does not cover that.
-- An event's write lands on such a row only if it still holds what the event's read found;
-- otherwise its statement fails whole with this error (serialization_failure), nothing is
-- written, and the worker reads again (docs/design.md §3.5).
CREATE FUNCTION inbox_register_moved(register text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'the % was written by another account''s event since the read', register
        USING ERRCODE = 'serialization_failure';
END
$$;
