-- A lease is named by the event's id and its claim generation, which every claim raises and
-- nothing lowers (docs/design.md §3). `attempts` counts toward `dead` and a replay rightly
-- resets it, so a worker whose lease ran out could match a replayed event's new claim by it.
ALTER TABLE inbox_events ADD COLUMN claim_gen bigint NOT NULL DEFAULT 0;
