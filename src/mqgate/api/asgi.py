"""Entry point for ASGI servers that import the app by name: settings from `MQGATE_*`."""

from __future__ import annotations

from mqgate.api.app import build_app
from mqgate.api.http import App
from mqgate.settings import load_settings


def create_app() -> App:
    return build_app(load_settings())
