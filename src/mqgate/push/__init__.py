"""Push delivery (issue 31): the gateway POSTs a push consumer's messages to its endpoint."""
