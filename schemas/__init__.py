"""Value types shared by the capture and apply services, and the wire contract between them.

The wire contract (docs/wire-contract.md) is the public format of the change topics. It
is pure code here, with no Kafka I/O:

- :mod:`schemas.change_record` builds a table's key and value schemas and encodes changes;
- :mod:`schemas.reader` decodes keys and values for any consumer;
- :mod:`schemas.single_object` frames records (``C3 01`` + fingerprint + body);
- :mod:`schemas.schema_topic` defines the records of the schema topic;
- :mod:`schemas.column_type`, :mod:`schemas.operation`, :mod:`schemas.headers` and
  :mod:`schemas.naming` fix column types, operations, headers and names;
- ``schemas/avro/*.avsc`` hold the fixed Avro schemas (:mod:`schemas.envelope`).
"""
