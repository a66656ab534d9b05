"""The registry of topics, producers and consumers (SPEC G2)."""

from mqgate.registry.cache import RegistryCache
from mqgate.registry.records import ConsumerRecord, ProducerRecord, TopicRecord
from mqgate.registry.sql import SqlRegistry

__all__ = ["ConsumerRecord", "ProducerRecord", "RegistryCache", "SqlRegistry", "TopicRecord"]
