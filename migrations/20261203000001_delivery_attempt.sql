-- The intake's own id for the request that recorded a delivery (docs/design.md §1.1). When a
-- statement's reply is lost, the same request stores again on a new connection; that second
-- attempt finds its first by this id, and the one delivery is counted and recorded once.
-- Looked up only through `deliveries_event` (the event's few deliveries), so no index of its
-- own. NULL for reads from a provider's API and rows from before it.
ALTER TABLE deliveries ADD COLUMN attempt uuid;
