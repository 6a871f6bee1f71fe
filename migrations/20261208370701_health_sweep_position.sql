-- The sweep of a source's subscriptions that a Stripe event generation failure (a health
-- notice) makes when it names no object (docs/design.md §6.2): its place in the list and what
-- it found so far, written with each page's reads, so that an attempt that runs out of its
-- budget is continued by the next from the page after, and a finished sweep is never read
-- again (a replay finds it). Purged with its notice.
CREATE TABLE health_sweeps (
    event_id    bigint      PRIMARY KEY REFERENCES inbox_events (id) ON DELETE CASCADE,
    -- The alert the notice's event names (`data.alert_id`), read once, by the first attempt.
    alert       text        NOT NULL,
    -- The last subscription read: the next page starts after it (NULL: the first page).
    page_after  text,
    pages       integer     NOT NULL DEFAULT 0,
    listed      integer     NOT NULL DEFAULT 0,
    differing   integer     NOT NULL DEFAULT 0,
    stored      integer     NOT NULL DEFAULT 0,
    -- Set when the last page has been read.
    finished_at timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT inbox_now()
);
