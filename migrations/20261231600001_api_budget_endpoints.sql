-- A budget per endpoint beside the source's own (docs/design.md §6.7): a provider that limits
-- each endpoint apart (Stripe: "individual API endpoints: 25 requests per second") has one
-- row per source and endpoint (a method and path with its ids taken out), taken in the same
-- statement as the source's row. The source's own row is the one whose `endpoint` is ''.
ALTER TABLE api_budgets ADD COLUMN endpoint text NOT NULL DEFAULT '';
ALTER TABLE api_budgets DROP CONSTRAINT api_budgets_pkey;
ALTER TABLE api_budgets ADD PRIMARY KEY (source, endpoint);
