-- depends: 0005.results

-- What operators and tracing read (issue 12).
--
-- trace_context: the W3C trace context (traceparent, tracestate) of the span
-- that enqueued the job, as the carrier dict OpenTelemetry's propagator
-- writes; NULL when tracing is off. A column of its own, never inside the
-- user's payload, so that payload replays and idempotency compare only what
-- the user sent.
ALTER TABLE jobrun.jobs ADD COLUMN trace_context jsonb;

-- Dead jobs per queue (the cluster metrics and `jobrun depth`): dead rows
-- stay until purged, and counting them must not read the succeeded ones.
-- The queued and leased states have their partial indexes already
-- (jobs_claim_idx, jobs_leased_idx).
CREATE INDEX jobs_dead_idx ON jobrun.jobs (queue) WHERE state = 'dead';

-- When the leader last materialised an occurrence of each schedule.
ALTER TABLE jobrun.schedules ADD COLUMN last_fired_at timestamptz;

UPDATE jobrun.schema_version SET version = 6, at = now();
