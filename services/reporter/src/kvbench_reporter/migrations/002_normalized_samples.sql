-- engine samples carry kvbench's engine-neutral counters and GPU power/utilization next to the raw series
ALTER TABLE engine_samples ADD COLUMN normalized jsonb NOT NULL DEFAULT '{}';
ALTER TABLE engine_samples ADD COLUMN gpus jsonb NOT NULL DEFAULT '[]';
