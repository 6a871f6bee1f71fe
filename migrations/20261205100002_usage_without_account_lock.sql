-- A debit holds no lock on its account row (docs/design.md §4.10, usage). The foreign keys
-- of usage_debits and usage_periods made every debit take the account row FOR KEY SHARE
-- until it committed, and the worker's unlocked commit (`FOR UPDATE SKIP LOCKED` on that
-- row) then took the account for moved: on a busy account every event went the locked way.
-- inbox_debit checks that the account exists before it writes, and accounts are never
-- deleted (a deletion is a tombstone), so the keys guarded nothing the function does not.
ALTER TABLE usage_debits DROP CONSTRAINT usage_debits_source_customer_id_fkey;
ALTER TABLE usage_periods DROP CONSTRAINT usage_periods_source_customer_id_fkey;
