// A consumer that works with rebound (amqplib). A failed message is
// rejected WITHOUT requeue, so RabbitMQ dead-letters it to rebound, which
// sends it back after a delay; a permanent failure is handed to rebound
// marked non-retryable, and parked at once. amqplib's nack() and reject()
// requeue unless told not to: a failure would come straight back, with no
// delay and no limit.
const amqp = require('amqplib');

const APP_QUEUE = process.env.APP_QUEUE ?? 'orders'; // the queue this service consumes
const INBOX_QUEUE = process.env.INBOX_QUEUE ?? 'rebound.inbox'; // REBOUND_INBOX_QUEUE

// A failure that retrying cannot fix.
class PermanentError extends Error {}

// settle runs handle on one delivery, then acks it, rejects it to rebound,
// or hands it over as permanent. out is a confirm channel.
async function settle(ch, out, msg, handle) {
  try {
    await handle(msg);
    ch.ack(msg);
    return;
  } catch (err) {
    if (err instanceof PermanentError) {
      try {
        await markPermanent(out, msg, err);
        ch.ack(msg); // only once the broker has confirmed the copy
        return;
      } catch {
        // Not taken: reject it below; rebound retries it as an ordinary failure.
      }
    }
  }
  ch.nack(msg, false, false); // allUpTo=false, requeue=false: dead-lettered to rebound
}

// markPermanent republishes msg to rebound's inbox marked non-retryable,
// with every header kept (rebound reads its state from them), and resolves
// once the broker has confirmed the copy.
async function markPermanent(out, msg, cause) {
  const p = msg.properties;
  const headers = {
    ...p.headers,
    'x-retry-non-retryable': true,
    'x-retry-error': String(cause.message).slice(0, 1000),
    'x-retry-origin-queue': APP_QUEUE, // where `rebound parked replay` sends it back
  };
  let returned = false;
  const onReturn = () => { returned = true; }; // no inbox queue: the broker returns the copy before confirming it
  out.once('return', onReturn);
  try {
    await new Promise((resolve, reject) => out.publish('', INBOX_QUEUE, msg.content, {
      mandatory: true, headers, contentType: p.contentType, contentEncoding: p.contentEncoding,
      deliveryMode: p.deliveryMode, priority: p.priority, correlationId: p.correlationId,
      replyTo: p.replyTo, messageId: p.messageId, timestamp: p.timestamp, type: p.type, appId: p.appId,
    }, (err) => (err ? reject(err) : resolve())));
  } finally {
    out.removeListener('return', onReturn);
  }
  if (returned) throw new Error(`no queue ${INBOX_QUEUE}`);
}

async function consume(url, handle) {
  const conn = await amqp.connect(url);
  const ch = await conn.createChannel();
  const out = await conn.createConfirmChannel();
  await ch.prefetch(1); // one at a time: a permanent failure waits for its confirm
  await ch.consume(APP_QUEUE, (msg) => settle(ch, out, msg, handle), { noAck: false });
  return conn;
}

module.exports = { PermanentError, settle, markPermanent, consume };
