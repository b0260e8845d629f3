"""Rows to Avro: PostgreSQL types onto the contract's column types (the type map and the
catalog it reads), the per-table codec that turns a tuple into a record's key and value,
and the compiled row encoder. Shared by the stream and the snapshot.
"""
