-- The event a read was made for (docs/design.md §3.9, §4.11): a provider read the worker
-- stores (a thin event's object, an invoice's subscription, a health notice's object or
-- sweep) names, when it is stored, the row of the event it was made for. The purge keeps a
-- read while that event is stored, and the fold of an account takes the reads made for its
-- finished events, by this id. Both once parsed it out of the read's key (`read:<its key>`,
-- `read:<its key>:<object>`), which fails for a key that holds `:` itself (every Lemon
-- Squeezy key) and for a read made for a read (a thin invoice's subscription,
-- `read:read:evt_…:sub_…`): such a read was purged while the payment it decided was kept.
-- No foreign key: the event may be purged first, and then the read goes in the purge's next
-- run (a cascade would make every purged event probe this column).
ALTER TABLE inbox_events ADD COLUMN made_for bigint;

-- The reads stored before: their maker by their key, the key without `read:`, else without
-- `read:` and its last `:<object>` (an object id holds no `:`), so that every read whose
-- event is still stored names it.
UPDATE inbox_events r
SET made_for = COALESCE(
        (SELECT m.id FROM inbox_events m
         WHERE m.source = r.source AND m.dedupe_key = substr(r.dedupe_key, 6)),
        (SELECT m.id FROM inbox_events m
         WHERE m.source = r.source
           AND m.dedupe_key = regexp_replace(substr(r.dedupe_key, 6), ':[^:]*$', '')))
WHERE r.dedupe_key LIKE 'read:%';
