"""The AMQP 1.0 client of e2e/amqp10_test.go (Debian's python3-qpid-proton).

ACTION=send puts one message of each case on QUEUE; ACTION=reject takes
COUNT messages off QUEUE and settles each with the outcome its "outcome"
property names (rejected, or modified and undeliverable here), which
RabbitMQ 4 answers by dead-lettering it; ACTION=receive takes COUNT
messages off QUEUE, accepts them and prints, as JSON, what each carries
with its AMQP 1.0 type.
"""
import json
import os
import uuid
from urllib.parse import quote

from proton import Delivery, Message, symbol, ulong
from proton.utils import BlockingConnection

# STARTED_AT (Unix ms) goes in x-task-started-at, as a message annotation
# in one case and as an application property in another.
STARTED_AT = int(os.environ.get("STARTED_AT", "0"))

CASES = [
    # A string id, a subject, a data body and every kind of property.
    dict(id="order-1", subject="order.created", body=b'{"order": 1}', inferred=True,
         content_type="application/json", correlation_id="corr-1",
         annotations={symbol("x-task-started-at"): STARTED_AT},
         properties={"case": "string-id", "outcome": "rejected", "text": "x", "count": 42,
                     "flag": True, "tier": symbol("vip")}),
    dict(id=uuid.UUID("3f1b7c2e-8a4d-4e6f-9b0a-1c2d3e4f5a6b"), body="hello",
         properties={"case": "uuid-id", "outcome": "modified", "x-task-started-at": STARTED_AT}),
    dict(id=ulong(7), body=b"seven", inferred=True,
         properties={"case": "ulong-id", "outcome": "rejected"}),
    dict(id=b"\x01\x02\x03", body=b"binary", inferred=True,
         properties={"case": "binary-id", "outcome": "modified"}),
]


def typed(v):
    """A value with its AMQP 1.0 type, as proton decoded it."""
    if v is None:
        return None
    for t, name in ((symbol, "symbol"), (ulong, "ulong"), (bool, "boolean"), (uuid.UUID, "uuid"),
                    (bytes, "binary"), (str, "string"), (int, "long")):
        if isinstance(v, t):
            return {"type": name, "value": v.hex() if isinstance(v, bytes) else str(v)}
    return {"type": type(v).__name__, "value": repr(v)}


def message_id(v):
    """A message-id: an integer one can only be a ulong (proton hands it over
    as a plain int)."""
    t = typed(v)
    if t and t["type"] == "long":
        t["type"] = "ulong"
    return t


def describe(m):
    return {
        "id": message_id(m.id),
        "subject": m.subject,
        "content_type": str(m.content_type) if m.content_type and str(m.content_type) != "None" else None,
        "correlation_id": message_id(m.correlation_id),
        "body_section": "data" if m.inferred and isinstance(m.body, bytes) else "amqp-value",
        "body": typed(m.body),
        "properties": {k: typed(v) for k, v in (m.properties or {}).items()},
        "annotations": {str(k): typed(v) for k, v in (m.annotations or {}).items()},
    }


def main():
    env = os.environ
    conn = BlockingConnection(env["AMQP10_URL"], allowed_mechs="PLAIN", timeout=30)
    address = "/queues/" + quote(env["QUEUE"], safe="")
    action = env["ACTION"]
    try:
        if action == "send":
            sender = conn.create_sender(address)
            for c in CASES:
                sender.send(Message(**c))  # waits until the broker has accepted it
            return
        receiver = conn.create_receiver(address, credit=1)
        seen = []
        for _ in range(int(env["COUNT"])):
            m = receiver.receive(timeout=30)
            if action == "receive":
                seen.append(describe(m))
                receiver.accept()
            elif m.properties["outcome"] == "rejected":
                receiver.reject()
            else:
                d = receiver.fetcher.unsettled[0]
                d.local.failed = True
                d.local.undeliverable = True
                receiver.settle(Delivery.MODIFIED)
        if action == "receive":
            print(json.dumps(seen))
    finally:
        conn.close()


main()
