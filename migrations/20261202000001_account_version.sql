-- An account's version: every worker statement that writes an event about the account moves
-- it, and writes only if it is still the version the event's read found (docs/design.md §8).
-- So an event is read and written in two statements without holding the account's lock, and
-- a write that another event's commit overtook writes nothing and is read again.
ALTER TABLE accounts ADD COLUMN version bigint NOT NULL DEFAULT 0;
