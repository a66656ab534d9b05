"""The embedded store in a process of its own, for `mqgate serve --workers N`.

One process owns the data directory's files (the message logs, the offsets journal, the
schedule log: one writer per file, which their durability rests on) and serves the three
backend contracts over a Unix socket; each gateway worker reaches them through the remote
adapters (`store/backends/remote`, `offsets/backends/remote`, `scheduler/backends/remote`),
which keep the shared-store semantics the Redis adapters have. The process itself is
`cli/store_process.py`, started and restarted by `cli/store_supervisor.py`. See docs/WORKERS.md.
"""
