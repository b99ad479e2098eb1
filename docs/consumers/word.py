"""Telling rebound why a message failed, and when to try again (pika 1.x).

A rejection carries no words, so an AMQP 0-9-1 consumer that wants rebound
to know the error (it groups parked messages by it) or to wait at least as
long as a dependency asked (HTTP 429 with Retry-After) republishes the
message to rebound's inbox with headers, waits for the broker's confirm,
then acks the original. ch is in confirm mode.
"""
import os

import pika
from pika.exceptions import NackError, UnroutableError

APP_QUEUE = os.environ.get("APP_QUEUE", "orders")  # the queue this service consumes
INBOX_QUEUE = os.environ.get("INBOX_QUEUE", "rebound.inbox")  # REBOUND_INBOX_QUEUE


def report_failure(ch, method, props, body, cause, retry_after_ms=None, permanent=False):
    headers = dict(props.headers or {})  # every header kept: rebound's state is in them
    headers["x-retry-error"] = str(cause)[:1000]
    headers["x-retry-origin-queue"] = APP_QUEUE
    # The retry count this error belongs to; rebound also works it out alone.
    headers["x-retry-error-retry"] = headers.get("x-retry-count", 0)
    if retry_after_ms is not None:
        headers["x-retry-after"] = int(retry_after_ms)  # or an RFC 3339 time
    if permanent:
        headers["x-retry-non-retryable"] = True
    copy = pika.BasicProperties(
        content_type=props.content_type, content_encoding=props.content_encoding,
        delivery_mode=props.delivery_mode, priority=props.priority,
        correlation_id=props.correlation_id, reply_to=props.reply_to,
        message_id=props.message_id, timestamp=props.timestamp, type=props.type,
        app_id=props.app_id, headers=headers)
    try:
        ch.basic_publish("", INBOX_QUEUE, body, properties=copy, mandatory=True)
    except (UnroutableError, NackError):
        ch.basic_reject(method.delivery_tag, requeue=False)  # rebound gets it without the words
    else:
        ch.basic_ack(method.delivery_tag)
