-- Credits applied by the worker (docs/design.md §4.14). A grant's register holds the latest
-- snapshot (`event_id`) and the earliest void any snapshot said (absorbing): the event that
-- said that void is kept as long as the grant is (§3.9), so `voided_by` names it.
ALTER TABLE credit_grants ADD COLUMN voided_by bigint;

CREATE INDEX credit_grants_voided_by ON credit_grants (voided_by) WHERE voided_by IS NOT NULL;

-- The scheduler's tick finds the grants whose expiry, void or effective time passed lately
-- (docs/design.md §4.14) by these times.
CREATE INDEX credit_grants_expires_at ON credit_grants (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX credit_grants_voided_at ON credit_grants (voided_at) WHERE voided_at IS NOT NULL;
CREATE INDEX credit_grants_effective ON credit_grants ((COALESCE(effective_at, created_at)));
