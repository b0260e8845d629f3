"""Apply job: Spark Structured Streaming from the change topics into Delta tables."""
