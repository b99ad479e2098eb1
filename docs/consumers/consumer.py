"""A consumer that works with rebound (pika 1.x, BlockingConnection).

A failed message is rejected WITHOUT requeue, so RabbitMQ dead-letters it to
rebound, which sends it back after a delay; a permanent failure is handed to
rebound marked non-retryable, and parked at once. requeue=True would bring a
failure straight back, with no delay and no limit.
"""
import os

import pika
from pika.exceptions import NackError, UnroutableError

APP_QUEUE = os.environ.get("APP_QUEUE", "orders")  # the queue this service consumes
INBOX_QUEUE = os.environ.get("INBOX_QUEUE", "rebound.inbox")  # REBOUND_INBOX_QUEUE


class PermanentError(Exception):
    """A failure that retrying cannot fix."""


def settle(ch, method, props, body, handle):
    """Runs handle on one delivery, then acks it, rejects it to rebound, or
    hands it over as permanent. ch is in confirm mode."""
    try:
        handle(props, body)
    except PermanentError as e:
        try:
            mark_permanent(ch, props, body, e)
        except (UnroutableError, NackError):
            # Not taken: rebound still gets it, as an ordinary failure.
            ch.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch.basic_ack(method.delivery_tag)  # only once the broker has confirmed the copy
    except Exception:
        ch.basic_reject(method.delivery_tag, requeue=False)  # dead-lettered to rebound
    else:
        ch.basic_ack(method.delivery_tag)


def mark_permanent(ch, props, body, cause):
    """Republishes the message to rebound's inbox marked non-retryable, with
    every header kept (rebound reads its state from them)."""
    headers = dict(props.headers or {})
    headers["x-retry-non-retryable"] = True
    headers["x-retry-error"] = str(cause)[:1000]
    headers["x-retry-origin-queue"] = APP_QUEUE  # where `rebound parked replay` sends it back
    copy = pika.BasicProperties(
        content_type=props.content_type, content_encoding=props.content_encoding,
        delivery_mode=props.delivery_mode, priority=props.priority,
        correlation_id=props.correlation_id, reply_to=props.reply_to,
        message_id=props.message_id, timestamp=props.timestamp, type=props.type,
        app_id=props.app_id, headers=headers)
    # In confirm mode basic_publish returns once the broker has confirmed the
    # copy, and raises UnroutableError (no inbox queue) or NackError.
    ch.basic_publish("", INBOX_QUEUE, body, properties=copy, mandatory=True)


def consume(url, handle):
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_qos(prefetch_count=1)
    ch.basic_consume(APP_QUEUE, lambda ch, method, props, body: settle(ch, method, props, body, handle))
    ch.start_consuming()
