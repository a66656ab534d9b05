"""Transactional (half) messages on mqgate's own parts, for every door that offers them: the
Aliyun MQ API (`trans=commit|rollback|pop`) and the native routes (`/mq/half…`). The data path
knows nothing of them: a half message is an ordinary message of a hidden topic (half.py)."""
