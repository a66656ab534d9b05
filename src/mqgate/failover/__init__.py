"""Store clusters grouped in pools, per-project failover and the producer spool (SPEC P8, E7).

- `pool`: named clusters, each built into a message store, offset store and scheduler like the
  gateway's own store, probed in the background; their states feed `core.failover`;
- `spool`: the local durable producer spool for produces no cluster could take;
- `switch`: which cluster each project writes to, agreed by every gateway through a shared
  record, and the steps around a switch (re-declare on the backup, clean up the failed one).

See docs/FAILOVER.md.
"""
