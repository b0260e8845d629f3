"""The control topic's side of apply: what a batch did (:mod:`.progress`), the Kafka side
that reads writer schemas and publishes the progress (:mod:`.feedback`), and each
table's errored state (:mod:`.table_status`).

Importing this package starts no Spark: ``python -m apply errored`` and ``python -m
pipeline status`` read the table statuses without it.
"""
