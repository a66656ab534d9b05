"""Projects (SPEC P1): per-project queues and trace topics."""
