"""What both services need to run, one floor below them and one above ``schemas/``.

``capture/`` and ``apply/`` import from here; nothing here imports either of them:
errors classified by what happens next (:mod:`runtime.errors`), the one retry policy
(:mod:`runtime.retry`), the settings table ``--help`` prints
(:mod:`runtime.settings_table`), Kafka client properties and their secrets
(:mod:`runtime.kafka_client`), and the metrics/health endpoint and log format
(:mod:`runtime.telemetry`, :mod:`runtime.logs`).
"""
