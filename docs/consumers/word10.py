"""Telling rebound why a message failed, over AMQP 1.0 (qpid-proton).

On RabbitMQ 4.x an AMQP 1.0 consumer settles a failed delivery with the
modified outcome (delivery-failed, undeliverable-here) and message
annotations: the broker dead-letters the message to rebound with them, from
a quorum queue. A classic queue drops the annotations (the message still
reaches rebound, without the words): there, use headers (word.py).
"""
from proton import Delivery, symbol


def fail(receiver, cause, retry_after_ms=None, permanent=False):
    """Settles the oldest unsettled delivery of receiver (a
    proton.utils.BlockingReceiver) as failed, with rebound's annotations."""
    annotations = {symbol("x-opt-retry-error"): str(cause)[:1000]}
    if retry_after_ms is not None:
        annotations[symbol("x-opt-retry-after")] = int(retry_after_ms)
    if permanent:
        annotations[symbol("x-opt-retry-non-retryable")] = True
    delivery = receiver.fetcher.unsettled[0]
    delivery.local.failed = True
    delivery.local.undeliverable = True
    delivery.local.annotations = annotations
    receiver.settle(Delivery.MODIFIED)
