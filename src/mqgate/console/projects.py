"""Which project a topic, producer or consumer belongs to (SPEC P1).

Every topic carries its `project` in the registry (`default` for topics made before projects
existed); a producer or consumer belongs to its topic's project.
"""

from __future__ import annotations

from mqgate.names import INTERNAL_PREFIXES
from mqgate.registry.records import DEFAULT_PROJECT, ConsumerRecord, ProducerRecord, Snapshot, TopicRecord
from mqgate.services.gateway import Gateway

__all__ = ["DEFAULT_PROJECT", "all_projects", "create_topic_in", "project_of", "topic_project", "user_topics"]


def topic_project(t: TopicRecord) -> str:
    return t.project or DEFAULT_PROJECT


def project_of(snapshot: Snapshot, rec: TopicRecord | ProducerRecord | ConsumerRecord) -> str:
    if isinstance(rec, TopicRecord):
        return topic_project(rec)
    t = snapshot.topics.get(rec.topic)
    return topic_project(t) if t is not None else DEFAULT_PROJECT


def all_projects(snapshot: Snapshot) -> list[str]:
    names = {DEFAULT_PROJECT, *snapshot.projects}
    names.update(topic_project(t) for t in snapshot.topics.values())
    return sorted(names)


def user_topics(snapshot: Snapshot) -> list[TopicRecord]:
    """Topics people made (not a consumer's dead letters, retry queue or inbox, nor a project's
    trace topic), by name."""
    return sorted(
        (t for t in snapshot.topics.values() if not t.name.startswith(INTERNAL_PREFIXES)),
        key=lambda t: t.name,
    )


async def create_topic_in(
    gateway: Gateway, name: str, project: str, queues: int, retention_ms: int, max_priority: int
) -> TopicRecord:
    """Create a topic in `project` (which must exist: 404 naming `project` otherwise)."""
    return await gateway.topology.create_topic(
        name, queues, retention_ms, None, max_priority, project=project or DEFAULT_PROJECT
    )
