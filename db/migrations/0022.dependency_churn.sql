-- depends: 0021.claim_function

-- Room on job_dependencies' pages for each edge's one update (issue 29, the
-- cost per node; issue 27, fewer index entries written per job).
--
-- A workflow's edges are inserted together when it is enqueued, so they
-- fill their pages (fillfactor 100, the default), and each edge is then
-- updated once, when its parent finishes (done = true; again only if an
-- operator retries the workflow). With no room left on its page, that new
-- version went to another page and into both indexes (the primary key and
-- job_dependencies_parent_idx), although done is in neither. With half of
-- each page free, the update stays on its page and is HOT: no index entry.
-- Measured on PostgreSQL 15, 32 chains of 1,000 edges marked done a level
-- at a time, 32 edges per statement: 32,000 updates, none HOT at fillfactor
-- 100 and all HOT at 50; 504 against 166 ms (15.7 against 5.2 us an edge),
-- and the primary key 324 against 272 pages. The table is about twice as
-- large (an edge is about 60 bytes).
--
-- Locks and time: ALTER TABLE ... SET (fillfactor) takes SHARE UPDATE
-- EXCLUSIVE (enqueues and completions go on) and rewrites nothing: pages
-- already filled keep what they hold; new pages leave the room.
ALTER TABLE jobrun.job_dependencies SET (fillfactor = 50);

UPDATE jobrun.schema_version SET version = 22, at = now();
