-- Credits applied by the worker (docs/design.md §4.14). A grant's register holds the latest
-- snapshot (`event_id`) and the earliest void any snapshot said (absorbing): the event that
-- said that void is kept as long as the grant is (§3.9), so `voided_by` names it.
ALTER TABLE credit_grants ADD COLUMN voided_by bigint;

CREATE INDEX credit_grants_voided_by ON credit_grants (voided_by) WHERE voided_by IS NOT NULL;
