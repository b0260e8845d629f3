"""Snapshots: a run that copies tables at one consistent point, its chunks, the worker
processes that read them with COPY, the COPY text parser, and the changes held back on
disk while a table is copied.

A snapshot produces the same records as the stream (:mod:`capture.records`, encoded by
:mod:`capture.rows`) and never imports :mod:`capture.stream`, which drives it.
"""
