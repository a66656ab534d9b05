"""Message stores: the durable logs behind every topic."""

from mqgate.store.interface import MessageStore, TopicConfig

__all__ = ["MessageStore", "TopicConfig"]
