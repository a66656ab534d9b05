"""The sans-IO core: pure rules for queue choice, locks, acks, tokens and rate limits."""
