"""Capture service: PostgreSQL logical replication (pgoutput) to per-table Avro topics.

Where things live (docs/architecture.md, floors of the code, has the table):
``service.py`` wires one attempt; ``source/`` sets up the source database;
``stream/`` reads the slot and turns its messages into records (``stream/loop.py`` is
the replication loop); ``snapshot/`` copies tables; ``rows/`` maps types and encodes
rows; ``publish/`` is the Kafka side; ``pgoutput/`` decodes messages; ``records.py``
and ``in_flight.py`` are shared by the stream and the snapshot.
"""
