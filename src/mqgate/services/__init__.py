"""What the gateway does, with no HTTP in it: the API, the CLI and the console call these."""
