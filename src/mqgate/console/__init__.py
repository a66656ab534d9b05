"""The web console (issue 13): sign-in with project roles, topics, producers and consumers,
consumer operations, the message browser, dead letters, self-service with approval, audit.

`build_console(platform, settings, registry_engine)` gives it as a door of the web layer;
`mqgate.app.build_site` mounts it beside the API. The audit log (`mqgate.console.audit.AuditLog`)
needs no more than SQLAlchemy, so the API and the CLI record their changes without importing
the pages.
"""
