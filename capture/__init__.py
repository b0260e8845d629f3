"""Capture service: PostgreSQL logical replication (pgoutput) to per-table Avro topics."""
