-- The event kept once (docs/design.md §3, §8): its signed raw body is the truth, and for a
-- delivery whose body is its JSON (every provider but one that signs a token), the parsed
-- payload is that body read again. Such an event is stored with `body_is_payload` and no
-- `payload`; a row stored before, or one whose payload is not its body's JSON (a token's
-- claims, a read's event built around the object, a body with NUL that jsonb refuses), keeps
-- its `payload` as before. Every reader asks `inbox_payload`, which gives the one or the
-- other, so each stored event reads as it did; no row is rewritten (an event's purge frees its
-- second copy).
ALTER TABLE inbox_events ADD COLUMN body_is_payload boolean NOT NULL DEFAULT false;

CREATE FUNCTION inbox_payload(payload jsonb, raw_body bytea, body_is_payload boolean)
    RETURNS jsonb LANGUAGE sql STABLE PARALLEL SAFE
    RETURN CASE WHEN body_is_payload THEN convert_from(raw_body, 'UTF8')::jsonb ELSE payload END;
