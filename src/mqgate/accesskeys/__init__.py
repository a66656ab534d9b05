"""Access keys for the SQS-compatible API (issue 30): an operator issues a key to a project; AWS
SDKs sign their requests with it (Signature Version 4, `mqgate.sqs.sigv4`). `service.py` holds
the keys and each gateway's copy of them, `tables.py` their table in the registry's database,
`sealing.py` how a secret is kept there: sealed with the gateway's secret, since verifying a
signature needs the secret itself, not a hash of it."""
