"""What the apply job runs on: the Spark session (:mod:`.spark_session`) and the jars it
loads (:mod:`.spark_jars`), and the properties of every Kafka client
(:mod:`.kafka_clients`).

Importing this package starts no Spark: only :mod:`.spark_session` imports pyspark.
"""
