"""The HTTP gateway: the service logic and its ASGI edge."""
