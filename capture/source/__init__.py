"""The source database: setup at every start (server, role, tables, publication, slot),
the credentials and connection options every capture connection uses, and the watch on
how much WAL the slot keeps.

Nothing here reads the replication stream (:mod:`capture.stream`) or copies tables
(:mod:`capture.snapshot`).
"""
