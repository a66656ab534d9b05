"""The HTTP edge: ASGI app, router with roles, request and answer shapes, one module of routes per area."""
