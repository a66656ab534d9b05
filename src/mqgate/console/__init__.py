"""The web console (issue 13): sign-in with project roles, topics, producers and consumers,
consumer operations, the message browser, dead letters, self-service with approval, audit.

Mount it with `mqgate.console.app.with_console(api_app, build_console(platform, settings,
registry_engine))`. The audit log (`mqgate.console.audit.AuditLog`) needs no more than
SQLAlchemy, so the API and the CLI record their changes without importing the pages.
"""
