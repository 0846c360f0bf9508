-- engine reads on command at the edges of a job's measured window (ReadEngines): the counters at the instants the
-- window starts and ends, which the report differences instead of the periodic scrapes nearest the edges
ALTER TABLE engine_samples ADD COLUMN job_id text;
ALTER TABLE engine_samples ADD COLUMN edge text;
ALTER TABLE engine_samples ADD COLUMN edge_at timestamptz;
