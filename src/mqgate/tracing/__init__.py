"""Message tracing (SPEC P2–P6): trace events, their writer into each project's trace topic,
the SQL query index and the indexer that feeds it. See docs/TRACING.md."""
