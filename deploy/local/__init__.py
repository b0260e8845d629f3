"""Real PostgreSQL and Kafka as local processes, for ``make up``, ``make demo`` and tests.

No Docker engine is needed: PostgreSQL comes from the system's binaries (Debian's
``postgresql`` package) and Kafka runs in KRaft combined mode from the jars that
``make jars`` resolves from Maven Central. Everything listens on free loopback ports and
keeps its data under ``.local/`` (ignored by git).
"""
