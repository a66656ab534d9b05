"""Alerts (SPEC G9): the pure rules, the service that evaluates them and the webhook."""
