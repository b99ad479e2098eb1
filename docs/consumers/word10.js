// Telling rebound why a message failed, over AMQP 1.0 (rhea). On RabbitMQ
// 4.x an AMQP 1.0 consumer settles a failed delivery with the modified
// outcome (delivery-failed, undeliverable-here) and message annotations: the
// broker dead-letters the message to rebound with them, from a quorum queue.
// A classic queue drops the annotations (the message still reaches rebound,
// without the words): there, use headers (word.js).
const { types } = require('rhea');

// fail settles the delivery of a 'message' event's context as failed, with
// rebound's annotations. The receiver is opened with autoaccept: false.
function fail(context, cause, { retryAfterMs, permanent } = {}) {
  const annotations = { 'x-opt-retry-error': String(cause.message).slice(0, 1000) }; // keys go out as symbols
  if (retryAfterMs !== undefined) annotations['x-opt-retry-after'] = types.wrap_long(retryAfterMs); // a long
  if (permanent) annotations['x-opt-retry-non-retryable'] = true;
  context.delivery.modified({ delivery_failed: true, undeliverable_here: true, message_annotations: annotations });
}

module.exports = { fail };
