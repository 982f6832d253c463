-- PLACEHOLDER for migration 0010, taken by another helper's branch (h-brokers, h-ledger):
-- lets this branch's 0011 load (versions must be 1..n). DROP THIS FILE ON MERGE.
SELECT 1;
