-- The audit's checked points (docs/design.md §4.11): per account, the fold of its events up to
-- a provider time, kept when an audit found the account clean, so that the next audit folds
-- only the events after it. A point is the fold of the events it covers and nothing else: any
-- change to one of them (an event finished late that sorts before the cut, a replay, a
-- settled read, the purge) drops its state, in the transaction that makes the change.

CREATE TABLE audit_points (
    source      text        NOT NULL,
    customer_id text        NOT NULL,
    -- Moved by every change to the account's finished events (below): the audit writes a point
    -- only over the value it read in its snapshot, so an event finished between its snapshot
    -- and its write is never left out of the point.
    moves       bigint      NOT NULL DEFAULT 0,
    -- Every event of the account the provider created at or before `cut` is folded in `state`
    -- (`billing::fold::FoldState`); none after it is. NULL: no point (yet, or dropped).
    cut         timestamptz,
    state       jsonb,
    -- The events folded in `state` the account does not own (named by its registers: a
    -- customer-less link), which the owner's changes do not move.
    foreign_ids bigint[]    NOT NULL DEFAULT '{}',
    -- The catalog, the source's kind and mode and the fold's version the state was folded
    -- under: a state folded under others is not resumed.
    fingerprint text,
    -- How many events the state folds, and when the audit that kept it found the account clean.
    events      bigint      NOT NULL DEFAULT 0,
    checked_at  timestamptz,
    PRIMARY KEY (source, customer_id)
)
-- The state out of line once the row passes 128 bytes: the trigger's update of `moves`, once
-- per finished event of an account with a point, then copies a pointer, not the state.
WITH (toast_tuple_target = 128);

-- An event of the account changed in a way the fold reads: the point moves, and its state goes
-- when the event sorts at or before its cut (the fold there is no longer what it holds).
CREATE FUNCTION audit_points_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.customer_key IS NOT NULL THEN
        UPDATE audit_points p
        SET moves = p.moves + 1,
            cut = CASE WHEN OLD.occurred_at <= p.cut THEN NULL ELSE p.cut END,
            state = CASE WHEN OLD.occurred_at <= p.cut THEN NULL ELSE p.state END
        WHERE p.source = OLD.source AND p.customer_id = OLD.customer_key;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.customer_key IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.customer_key IS DISTINCT FROM OLD.customer_key
            OR NEW.occurred_at IS DISTINCT FROM OLD.occurred_at) THEN
        UPDATE audit_points p
        SET moves = p.moves + 1,
            cut = CASE WHEN NEW.occurred_at <= p.cut THEN NULL ELSE p.cut END,
            state = CASE WHEN NEW.occurred_at <= p.cut THEN NULL ELSE p.state END
        WHERE p.source = NEW.source AND p.customer_id = NEW.customer_key;
    END IF;
    RETURN NULL;
END $$;

-- What the fold reads of an event: whether it is finished (`applied`, `ignored`; a read counts
-- with the event it was made for, so any change of a read's status), its account, its time and
-- what its provider read settled. A row that is neither finished before nor after changes
-- nothing the fold reads.
CREATE TRIGGER audit_points_inserted AFTER INSERT ON inbox_events FOR EACH ROW
    WHEN (NEW.status IN ('applied', 'ignored') OR NEW.dedupe_key LIKE 'read:%')
    EXECUTE FUNCTION audit_points_moved();
CREATE TRIGGER audit_points_updated AFTER UPDATE ON inbox_events FOR EACH ROW
    WHEN ((OLD.status IN ('applied', 'ignored') OR NEW.status IN ('applied', 'ignored')
           OR NEW.dedupe_key LIKE 'read:%')
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.settled IS DISTINCT FROM NEW.settled
               OR OLD.customer_key IS DISTINCT FROM NEW.customer_key
               OR OLD.occurred_at IS DISTINCT FROM NEW.occurred_at))
    EXECUTE FUNCTION audit_points_moved();
-- The purge takes a point's state with any event it covers, by the events' own rules.
CREATE TRIGGER audit_points_deleted AFTER DELETE ON inbox_events FOR EACH ROW
    WHEN (OLD.status IN ('applied', 'ignored') OR OLD.dedupe_key LIKE 'read:%')
    EXECUTE FUNCTION audit_points_moved();
