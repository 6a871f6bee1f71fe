-- What was done through the API to the store (docs/design.md §12.5): each replay, by whom
-- (the key's name), of what, when. The console's audit trail, and the window each key's
-- replays are counted in.
CREATE TABLE api_actions (
    id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT inbox_now(),
    who    text        NOT NULL,
    action text        NOT NULL,
    target text        NOT NULL,
    detail jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX api_actions_who_at ON api_actions (who, at);

-- Deliveries of a known source that the intake refused 401, counted by the minute: the
-- overview's "401s in the last hour". A source's rows older than a day go as new ones come.
CREATE TABLE intake_refusals (
    source text        NOT NULL,
    minute timestamptz NOT NULL,
    count  integer     NOT NULL DEFAULT 0 CHECK (count >= 0),
    PRIMARY KEY (source, minute)
);
