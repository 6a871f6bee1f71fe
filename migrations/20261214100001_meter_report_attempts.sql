-- A meter report's attempts (docs/design.md §4.13).
ALTER TABLE meter_reports
    -- Every claim's number, never reset (a replay resets `attempts`, not this): the
    -- `Idempotency-Key` of an attempt's request is the report's id and this number, so that a
    -- provider that saves its first answer per key (Stripe: 24 hours, 500s included) never
    -- answers a later attempt with an earlier one's.
    ADD COLUMN sends         integer     NOT NULL DEFAULT 0,
    -- The key of the last attempt's request. A cancel adjustment that went unanswered is sent
    -- again under the same key (Stripe has no other dedupe for it).
    ADD COLUMN send_key      text,
    -- When the last attempt began (a provider's error notice older than it says nothing of
    -- what that attempt sent).
    ADD COLUMN last_sent_at  timestamptz,
    -- Set while the report waits for others to settle (a correction for its report, a
    -- read-back for the other reports of its minute): a wait is not an attempt, and the
    -- report is armed again when they settle.
    ADD COLUMN waiting_since timestamptz;
