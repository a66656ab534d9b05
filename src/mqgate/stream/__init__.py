"""Streaming consumption (issue 31): one long answer carrying a consumer's batches as they come."""
