-- A subscription's end is part of its state (docs/design.md §4.4): the period end, a
-- scheduled cancellation, the trial end and the end itself, written with the status by the
-- event that wins the register's version. A row stored before this knows none of them.
ALTER TABLE subscriptions
    ADD COLUMN current_period_end timestamptz,
    ADD COLUMN cancel_at_period_end boolean NOT NULL DEFAULT false,
    ADD COLUMN cancel_at timestamptz,
    ADD COLUMN trial_end timestamptz,
    ADD COLUMN ended_at timestamptz;
