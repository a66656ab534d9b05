from mqgate.offsets.backends.embedded.store import EmbeddedOffsetStore

__all__ = ["EmbeddedOffsetStore"]
