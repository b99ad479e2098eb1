"""A producer (pika 1.x). Nothing is required by rebound; a message id lets
consumers drop the duplicates at-least-once delivery can make, and
x-task-started-at makes rebound's time budget (REBOUND_MAX_DURATION) count
from when the task began, for a task that began before this publish (a
re-enqueued task, a pipeline step)."""
import json
import os
import time

import pika

APP_QUEUE = os.environ.get("APP_QUEUE", "orders")


def publish_order(ch, message_id, order, started_at_ms):
    """Publishes on a channel in confirm mode: returns once the broker has
    confirmed the message."""
    ch.basic_publish("", APP_QUEUE, json.dumps(order).encode(), mandatory=True,
                     properties=pika.BasicProperties(
                         message_id=message_id, delivery_mode=2,
                         content_type="application/json",
                         timestamp=int(time.time()),  # seconds: the AMQP timestamp property
                         # Unix milliseconds; pika sends an int this large as a 64-bit long.
                         headers={"x-task-started-at": started_at_ms}))
