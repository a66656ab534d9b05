"""Which project a topic, producer or consumer belongs to (SPEC P1).

Topics carry a `project` in the registry; a producer or consumer belongs to its topic's
project. A registry from before projects has none: everything is in the default project.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from mqgate.names import INTERNAL_PREFIXES
from mqgate.registry.records import ConsumerRecord, ProducerRecord, Snapshot, TopicRecord
from mqgate.services.gateway import Gateway

DEFAULT_PROJECT: Final = "default"
TOPICS_HAVE_PROJECTS: Final = "project" in {f.name for f in dataclasses.fields(TopicRecord)}


def topic_project(t: TopicRecord) -> str:
    return str(getattr(t, "project", DEFAULT_PROJECT) or DEFAULT_PROJECT)


def project_of(snapshot: Snapshot, rec: TopicRecord | ProducerRecord | ConsumerRecord) -> str:
    if isinstance(rec, TopicRecord):
        return topic_project(rec)
    t = snapshot.topics.get(rec.topic)
    return topic_project(t) if t is not None else DEFAULT_PROJECT


def all_projects(snapshot: Snapshot) -> list[str]:
    names = {DEFAULT_PROJECT, *getattr(snapshot, "projects", {})}
    names.update(topic_project(t) for t in snapshot.topics.values())
    return sorted(names)


def user_topics(snapshot: Snapshot) -> list[TopicRecord]:
    """Topics people made (not a consumer's dead letters, retry queue or inbox), by name."""
    return sorted(
        (t for t in snapshot.topics.values() if not t.name.startswith(INTERNAL_PREFIXES)),
        key=lambda t: t.name,
    )


async def create_topic_in(
    gateway: Gateway, name: str, project: str, queues: int, retention_ms: int, max_priority: int
) -> TopicRecord:
    """Create a topic in `project` (the default project when the registry has none)."""
    rec = await gateway.topology.create_topic(name, queues, retention_ms, None, max_priority)
    if TOPICS_HAVE_PROJECTS and project != topic_project(rec):
        await gateway.ctx.registry.change("update_topic", name, project=project)
        rec = await gateway.topology.topic(name)
    return rec
