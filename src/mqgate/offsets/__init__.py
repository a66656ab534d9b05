"""Offset stores: the consumer-group table of SPEC G7."""

from mqgate.offsets.interface import Lease, OffsetEntry, OffsetStore

__all__ = ["Lease", "OffsetEntry", "OffsetStore"]
