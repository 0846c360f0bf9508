-- engine seconds per wall-clock second of a job's records (a simulated cluster paced faster than real time):
-- record times are engine seconds; a record's wall-clock moment is started_at + start_s / time_scale
ALTER TABLE jobs ADD COLUMN time_scale double precision NOT NULL DEFAULT 1;
