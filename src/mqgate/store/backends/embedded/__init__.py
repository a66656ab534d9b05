from mqgate.store.backends.embedded.store import EmbeddedStore

__all__ = ["EmbeddedStore"]
