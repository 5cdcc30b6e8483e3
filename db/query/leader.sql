-- The scheduler's leader as a lease row (jobrun.postgres.leader runs these,
-- nothing else does). Every time is the database clock; a term only grows.

-- name: AcquireLeader :one
-- Take the election `name` for `holder` when it has no row yet, or when its
-- lease ran out (by the database clock): the term goes up by one, so the
-- new leadership has a number no earlier one had. NULL when someone else's
-- lease is still running. Refused too while a session holds the advisory
-- leader lock (`lock_class`, `lock_key`): a process of the same deployment
-- elected through a direct connection is leading, and one mechanism must
-- not elect a second leader beside the other.
WITH advisory AS (
    SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks AS k
         WHERE k.locktype = 'advisory'
           AND k.classid = sqlc.arg(lock_class)::int4::oid
           AND k.objid = sqlc.arg(lock_key)::int4::oid
           AND k.objsubid = 2 AND k.granted
    ) AS held
)
INSERT INTO jobrun.leader AS l (name, holder, term, elected_at, renewed_at, expires_at)
SELECT sqlc.arg(name)::text, sqlc.arg(holder)::text, 1, now(), now(),
       now() + make_interval(secs => sqlc.arg(ttl_seconds)::float8)
  FROM advisory AS a
 WHERE NOT a.held
ON CONFLICT (name) DO UPDATE
   SET holder = EXCLUDED.holder, term = l.term + 1, elected_at = now(), renewed_at = now(),
       expires_at = EXCLUDED.expires_at
 WHERE l.expires_at <= now()
RETURNING l.term, l.expires_at;

-- name: RenewLeader :one
-- Extend the lease of term `term` by `ttl_seconds` from now, while it is
-- still this holder's and has not run out; NULL when the term is over.
UPDATE jobrun.leader AS l
   SET expires_at = now() + make_interval(secs => sqlc.arg(ttl_seconds)::float8),
       renewed_at = now()
 WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text
   AND l.term = sqlc.arg(term)::bigint AND l.expires_at > now()
RETURNING l.expires_at;

-- name: ResignLeader :execrows
-- End term `term` now (the row and its term stay, so the next term is higher).
UPDATE jobrun.leader AS l
   SET expires_at = now(), renewed_at = now()
 WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text
   AND l.term = sqlc.arg(term)::bigint AND l.expires_at > now();

-- name: FenceLeader :one
-- The fence, the first statement of every leader action's transaction: the
-- lease row of a running term `term` of `holder`, locked FOR SHARE until
-- that transaction ends, so a takeover (an UPDATE of the row) waits for the
-- action to commit or roll back. NULL when the term is over: the action is
-- refused before it has done anything.
SELECT l.term
  FROM jobrun.leader AS l
 WHERE l.name = sqlc.arg(name)::text AND l.holder = sqlc.arg(holder)::text
   AND l.term = sqlc.arg(term)::bigint AND l.expires_at > now()
   FOR SHARE;

-- name: GetLeader :one
-- The election's row as it is (for status and tests).
SELECT l.name, l.holder, l.term, l.elected_at, l.renewed_at, l.expires_at,
       l.expires_at > now() AS running
  FROM jobrun.leader AS l
 WHERE l.name = sqlc.arg(name)::text;
