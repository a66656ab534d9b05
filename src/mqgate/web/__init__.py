"""The one ASGI layer under the native API (mqgate.api), the console (mqgate.console) and the
compatibility edges: ASGI types, reading a request's headers and body within their limits, and
the router of routes by method and path. It knows no route, shape or page."""
