"""The replication stream: the connection that reads the slot, the CopyData framing, the
change stream that turns pgoutput messages into records, the compiled stream, the
table states and where each record goes, and the replication loop that drives them.

The stream starts snapshot runs (:mod:`capture.snapshot`) and routes their records;
the snapshot never imports the stream.
"""
