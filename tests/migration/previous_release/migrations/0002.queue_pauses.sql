-- depends: 0001.initial

-- Paused queues: workers claim nothing from a queue listed here; enqueue
-- still works, so a pause holds work back without losing any.
CREATE TABLE jobrun.queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
