// Telling rebound why a message failed, and when to try again (amqplib).
// A rejection carries no words, so the consumer republishes the message to
// rebound's inbox with headers, waits for the broker's confirm, then acks
// the original. `out` is a confirm channel, `ch` the consuming channel.
const APP_QUEUE = process.env.APP_QUEUE || 'orders';
const INBOX_QUEUE = process.env.INBOX_QUEUE || 'rebound.inbox'; // REBOUND_INBOX_QUEUE

async function reportFailure(ch, out, msg, cause, { retryAfterMs, permanent } = {}) {
  const p = msg.properties;
  const headers = { ...p.headers }; // every header kept: rebound's state is in them
  headers['x-retry-error'] = String(cause.message).slice(0, 1000);
  headers['x-retry-origin-queue'] = APP_QUEUE;
  headers['x-retry-error-retry'] = headers['x-retry-count'] || 0;
  if (retryAfterMs !== undefined) headers['x-retry-after'] = retryAfterMs; // or an ISO 8601 time
  if (permanent) headers['x-retry-non-retryable'] = true;
  let returned = false;
  const onReturn = () => { returned = true; }; // no inbox queue: returned before it is confirmed
  out.once('return', onReturn);
  try {
    await new Promise((resolve, reject) => out.publish('', INBOX_QUEUE, msg.content, {
      headers, mandatory: true, contentType: p.contentType, contentEncoding: p.contentEncoding,
      deliveryMode: p.deliveryMode, priority: p.priority, correlationId: p.correlationId,
      replyTo: p.replyTo, messageId: p.messageId, timestamp: p.timestamp, type: p.type, appId: p.appId,
    }, (err) => (err ? reject(err) : resolve())));
  } catch (err) {
    returned = true; // nacked
  } finally {
    out.removeListener('return', onReturn);
  }
  if (returned) {
    ch.nack(msg, false, false); // rebound gets it without the words
    return;
  }
  ch.ack(msg);
}

module.exports = { reportFailure };
