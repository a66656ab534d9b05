"""Trace analytics on Spark (SPEC P7, D3; docs/ANALYTICS.md).

The trace topics (`%TRACE%<project>`, one JSON event per message) are read incrementally with
the `mqgate` source into a Parquet dataset partitioned by date and project (`ingest`,
`source`), and the reports are computed from that dataset (`reports`, `latency`, `errors`)
and written as one self-contained HTML page and one JSON file (`render`). `generator` writes
a load-test trace whose figures are known, for the tests and the benchmark.

Importing this package loads nothing heavy: each module imports Spark where it runs.
"""
