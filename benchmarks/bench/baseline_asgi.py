"""Baseline A: the HTTP ceiling.

A minimal raw ASGI app (no framework): it reads the request body and answers a fixed JSON body
shaped like a gateway produce receipt. Served with the same server and worker count as the
gateway, it measures the most req/s the HTTP server can give on this machine.

    uvicorn benchmarks.baseline_asgi:app --http httptools --loop uvloop --no-access-log
    granian --interface asgi benchmarks.baseline_asgi:app
"""

BODY = (
    b'{"status":200,"message":"ok","result":{"msgId":"0195f0c2a1b2c3d4e5f60718293a4b5c",'
    b'"broker":"local","queue":3,"offset":41}}'
)
HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
]


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    # drain the request body, as a real handler would
    more = True
    while more:
        msg = await receive()
        more = msg.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
