"""Entry point for ASGI servers that import the app by name: settings from `MQGATE_*`."""

from __future__ import annotations

from mqgate.api.app import build_app
from mqgate.api.collector import tune_for_serving
from mqgate.api.http import App
from mqgate.settings import load_settings


def create_app() -> App:
    tune_for_serving()  # the workers of `mqgate serve --workers N` start here
    return build_app(load_settings())
