UPDATE jobrun.schema_version SET version = 18, at = now();
DROP TABLE jobrun.workflow_signal_deliveries;
DROP TABLE jobrun.workflow_signals;
