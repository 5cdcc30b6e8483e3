-- depends: 0004.schema_version

-- Results and waiting for them.
--
-- result: the JSON value a handler returned, written by Complete in the same
-- transaction as the success it belongs to (both paths), NULL otherwise.
--
-- notify_finished: set by a client waiting for the job (Client.wait). Every
-- transition that ends the job (Complete, Fail, the reaper, Cancel) sends a
-- notification with the job's id on the finish channel when it is set, in
-- the transaction that ends it; nobody pays for a wake-up nobody waits for.
-- Retry clears it with the rest of the finished job's state.
ALTER TABLE jobrun.jobs ADD COLUMN result jsonb;
ALTER TABLE jobrun.jobs ADD COLUMN notify_finished boolean NOT NULL DEFAULT false;

UPDATE jobrun.schema_version SET version = 5, at = now();
