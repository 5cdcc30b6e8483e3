DROP TABLE jobrun.queue_pauses;
