-- The event's row small (docs/design.md §8, §5.4): the payload and the raw body out of line once
-- the row passes 512 bytes. The worker updates an event's row about twice (its claim, its
-- finish), and an update writes the whole new row to the WAL; with the raw body inline (it
-- stayed there compressed, under the default 2 kB target, once the payload had gone out of
-- line) each update copied it. Out of line, an update copies a pointer. 512, not the least
-- (128): past the two, Postgres would move the row's short text columns (its key, its type) out
-- of line one by one, a TOAST row each.
ALTER TABLE inbox_events SET (toast_tuple_target = 512);
