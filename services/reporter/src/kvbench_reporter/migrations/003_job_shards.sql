-- a job may be shared by several load generator shards; what each shard saw of its traffic
ALTER TABLE jobs ADD COLUMN shards integer NOT NULL DEFAULT 1;
ALTER TABLE jobs ADD COLUMN shards_finished integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN skipped_arrivals integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN replay_lag_p99_s double precision;
ALTER TABLE jobs ADD COLUMN notes jsonb NOT NULL DEFAULT '[]';
CREATE INDEX events_job ON events (job_id, schema);
