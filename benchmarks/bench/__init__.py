"""The mqgate benchmarks, one module per concept; `benchmarks/run.py` is the entry point.

Every module imports only the standard library at its top, so `run.py --help` works anywhere;
mqgate, redis-py, httpx, pyspark and the like are imported where a benchmark needs them.
"""
