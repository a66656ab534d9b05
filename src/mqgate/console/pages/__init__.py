"""The console's pages, each module a group of routes."""

from __future__ import annotations

from mqgate.console.app import Console
from mqgate.web.route import Route


def all_routes(c: Console) -> list[Route]:
    from mqgate.console.pages.actions import ActionPages
    from mqgate.console.pages.admin import AdminPages
    from mqgate.console.pages.auth import AuthPages
    from mqgate.console.pages.charts import ChartPages
    from mqgate.console.pages.clusters import ClusterPages
    from mqgate.console.pages.live import LivePages
    from mqgate.console.pages.messages import MessagePages
    from mqgate.console.pages.operations import OperationsPages
    from mqgate.console.pages.projects import ProjectPages
    from mqgate.console.pages.selfservice import SelfServicePages
    from mqgate.console.pages.topic import TopicPages
    from mqgate.console.pages.topology import TopologyPages
    from mqgate.console.pages.traces import TracePages

    groups = (AuthPages, OperationsPages, TopologyPages, MessagePages, SelfServicePages, AdminPages,
              ProjectPages, TracePages, ChartPages, LivePages, ClusterPages, TopicPages,
              ActionPages)  # fmt: skip
    return [route for group in groups for route in group(c).routes()]
