"""Alibaba Cloud Message Queue for RocketMQ's HTTP API (issue 32), groundwork: pure modules only,
not served yet. `signature.py` verifies the `MQ <AccessKeyId>:<Signature>` HMAC-SHA1 signature,
`xml.py` decodes the request bodies and encodes the answers as the official SDKs read them,
`errors.py` holds the service's error codes and statuses. docs/ALIYUN.md is the protocol."""
