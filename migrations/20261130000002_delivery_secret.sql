-- Which of the source's configured secrets verified each delivery (its index in the list; NULL
-- for Kinde's key-set signatures and for events read back from a provider's API): an
-- operator rolling a secret sees when the old one stops being used (docs/deploy.md).
ALTER TABLE deliveries ADD COLUMN secret_index smallint;
