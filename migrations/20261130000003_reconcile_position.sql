-- Reconciliation walks a provider's event feed forward in time (docs/design.md §6.2): the
-- cursor is the time before which every event has been read; a window being read, and the
-- position within it, are saved after every page, so the next run resumes where this one
-- stopped.
ALTER TABLE reconcile_cursors
    ADD COLUMN window_end timestamptz,
    ADD COLUMN page_after text;

-- What a run found: events already stored are counted apart from new ones (a read is not a
-- delivery), and a run that stopped early says so and how far behind its cursor is.
ALTER TABLE reconcile_runs
    ADD COLUMN already_present integer NOT NULL DEFAULT 0,
    ADD COLUMN stopped_early   boolean NOT NULL DEFAULT false,
    ADD COLUMN behind_secs     double precision;
