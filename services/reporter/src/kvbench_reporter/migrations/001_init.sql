-- kvbench schema v1. The reporter is the only writer. Keys make every ingestion idempotent:
-- events by event_id, request records by (job_id, request_id).
CREATE TABLE runs (
    run_id        text PRIMARY KEY,
    plan_name     text NOT NULL,
    plan          jsonb NOT NULL,
    status        text NOT NULL DEFAULT 'pending',
    reasons       jsonb NOT NULL DEFAULT '[]',
    submitted_at  timestamptz NOT NULL,
    started_at    timestamptz,
    finished_at   timestamptz
);

CREATE TABLE workloads (
    run_id    text NOT NULL REFERENCES runs ON DELETE CASCADE,
    name      text NOT NULL,
    stack     text NOT NULL,
    strategy  text NOT NULL,
    spec      jsonb NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE test_points (
    run_id      text NOT NULL REFERENCES runs ON DELETE CASCADE,
    workload    text NOT NULL,
    load_level  double precision NOT NULL,
    PRIMARY KEY (run_id, workload, load_level)
);

CREATE TABLE jobs (
    job_id            text PRIMARY KEY,
    run_id            text NOT NULL REFERENCES runs ON DELETE CASCADE,
    workload          text NOT NULL,
    stack             text NOT NULL,
    load_level        double precision NOT NULL,
    repeat            integer NOT NULL,
    status            text NOT NULL DEFAULT 'pending',
    shard             text,
    records_expected  integer,
    load_duration_s   double precision,
    warmup_s          double precision,
    offered_load      double precision,
    tokenizer         text,
    reason            text,
    started_at        timestamptz,
    finished_at       timestamptz
);
CREATE INDEX jobs_run ON jobs (run_id, workload);

CREATE TABLE events (
    event_id     text PRIMARY KEY,
    schema       text NOT NULL,
    subject      text NOT NULL,
    run_id       text,
    job_id       text,
    node_id      text,
    occurred_at  timestamptz NOT NULL,
    payload      jsonb NOT NULL
);
CREATE INDEX events_run ON events (run_id, occurred_at);

CREATE TABLE request_records (
    job_id          text NOT NULL,
    request_id      text NOT NULL,
    run_id          text NOT NULL,
    workload        text NOT NULL,
    session_id      text,
    turn            integer,
    start_s         double precision NOT NULL,
    ttft_s          double precision,
    e2e_s           double precision,
    chunk_times_s   bytea NOT NULL,  -- float64 little-endian, one per content chunk (10x faster COPY than arrays)
    chunk_tokens    bytea NOT NULL,  -- int32 little-endian, aligned with chunk_times_s
    prompt_tokens   integer NOT NULL,
    output_tokens   integer NOT NULL,
    cached_tokens   integer,
    ok              boolean NOT NULL,
    error           text,
    shard           text,
    -- one index serves run, job and request look-ups; job ids are unique, so (job_id, request_id) is the key
    PRIMARY KEY (run_id, job_id, request_id)
);

CREATE TABLE engine_samples (
    event_id    text PRIMARY KEY,
    run_id      text NOT NULL,
    node_id     text NOT NULL,
    engine_id   text NOT NULL,
    sampled_at  timestamptz NOT NULL,
    samples     jsonb NOT NULL
);
CREATE INDEX engine_samples_run ON engine_samples (run_id, engine_id, sampled_at);

-- fabric counters (reference/fabric.md section 7); filled by the switch-poller's samples
CREATE TABLE fabric_samples (
    event_id     text NOT NULL,
    device       text NOT NULL,
    port         text NOT NULL,
    counter      text NOT NULL,
    qualifier    text NOT NULL DEFAULT '',
    value        numeric NOT NULL,
    unit         text NOT NULL,
    source       text NOT NULL,
    device_ts    timestamptz,
    poll_ts      timestamptz NOT NULL,
    reset_epoch  integer NOT NULL DEFAULT 0,
    PRIMARY KEY (event_id, device, port, counter, qualifier)
);

CREATE TABLE node_inventory (
    node_id     text PRIMARY KEY,
    inventory   jsonb NOT NULL,
    updated_at  timestamptz NOT NULL
);

CREATE TABLE reports (
    run_id      text PRIMARY KEY REFERENCES runs ON DELETE CASCADE,
    report      jsonb NOT NULL,
    html        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
