-- the load generator's own lag during a job, one entry per shard (kvbench_contracts.events.ClientTiming)
ALTER TABLE jobs ADD COLUMN client_timing jsonb NOT NULL DEFAULT '[]';
