-- every switch read, good or not (the publish gate needs both), and the counters' reset epoch as text
CREATE TABLE switch_reads (
    event_id  text PRIMARY KEY,
    switch    text NOT NULL,
    ok        boolean NOT NULL,
    reason    text,
    read_at   timestamptz NOT NULL
);
CREATE INDEX switch_reads_at ON switch_reads (switch, read_at);
ALTER TABLE fabric_samples ADD COLUMN epoch text NOT NULL DEFAULT '';
CREATE INDEX fabric_samples_device ON fabric_samples (device, port, counter, poll_ts);
