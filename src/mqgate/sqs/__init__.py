"""The Amazon SQS-compatible API (issue 30): AWS SDKs, the AWS CLI and boto3 use mqgate's topics
and consumers as SQS queues, signing their requests with access keys (`mqgate.accesskeys`).
`sigv4.py` verifies those signatures."""
