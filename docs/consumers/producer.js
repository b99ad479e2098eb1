// A producer (amqplib). Nothing is required by rebound; a message id lets
// consumers drop the duplicates at-least-once delivery can make, and
// x-task-started-at makes rebound's time budget (REBOUND_MAX_DURATION)
// count from when the task began, for a task that began before this
// publish (a re-enqueued task, a pipeline step).
const APP_QUEUE = process.env.APP_QUEUE ?? 'orders';

// publishOrder publishes on a confirm channel and resolves once the
// broker has confirmed the message.
function publishOrder(ch, messageId, order, startedAt) {
  return new Promise((resolve, reject) => ch.sendToQueue(APP_QUEUE, Buffer.from(JSON.stringify(order)), {
    messageId,
    persistent: true,
    contentType: 'application/json',
    timestamp: Math.floor(Date.now() / 1000), // seconds: the AMQP timestamp property
    headers: {
      // Unix milliseconds: a whole number this large goes out as a 64-bit long.
      'x-task-started-at': startedAt.getTime(),
    },
  }, (err) => (err ? reject(err) : resolve())));
}

module.exports = { publishOrder };
