// A txmq client in another language, generated at run time from protos/txmq/v1 with
// @grpc/proto-loader and @grpc/grpc-js: sends a half message, commits it, receives and
// acknowledges it, through the native services only (name server and broker; no SDK).
// Run by tests/proxy as: node native_txmq.js flow '{"nameserver": "host:port", ...}'
'use strict';

const path = require('path');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTOS = path.resolve(__dirname, '..', '..', '..', 'protos');

function load() {
  const definition = protoLoader.loadSync(
    ['txmq/v1/nameserver.proto', 'txmq/v1/broker.proto'],
    { includeDirs: [PROTOS], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true });
  return grpc.loadPackageDefinition(definition).txmq.v1;
}

function emit(event, fields) {
  process.stdout.write(JSON.stringify({ event, ...(fields || {}) }) + '\n');
}

function unary(client, method, request, seconds = 10) {
  return new Promise((resolve, reject) => {
    client[method](request, { deadline: Date.now() + seconds * 1000 }, (err, response) => {
      if (err) reject(err); else resolve(response);
    });
  });
}

async function flow(args) {
  const v1 = load();
  const insecure = grpc.credentials.createInsecure();
  const nameserver = new v1.NameServerService(args.nameserver, insecure);
  // for_send: a producer's lookup (only those auto-create a missing topic).
  const route = await unary(nameserver, 'QueryRoute', { topic: args.topic, for_send: true });
  const queue = route.queues[0];
  const broker = new v1.BrokerService(queue.broker_address, insecure);
  const messageId = `node-${crypto.randomBytes(12).toString('hex')}`;

  const sent = await unary(broker, 'SendMessage', { message: {
    topic: args.topic, body: Buffer.from(args.body), tag: 'TagJs', keys: ['js-key'],
    properties: { lang: 'node' }, message_id: messageId, type: 'MESSAGE_TYPE_TRANSACTION',
    producer_group: args.group, producer_client_id: 'node-generated', queue_id: queue.queue_id,
  } });
  emit('sent', { message_id: sent.message_id, transaction_id: sent.transaction_id, state: sent.transaction_state });

  const ended = await unary(broker, 'EndTransaction', {
    transaction_id: sent.transaction_id, message_id: messageId, resolution: 'TRANSACTION_RESOLUTION_COMMIT',
    source: 'TRANSACTION_SOURCE_CLIENT', producer_group: args.group,
  });
  emit('ended', { state: ended.state, queue_offset: ended.queue_offset });

  const deadline = Date.now() + 30000;
  while (Date.now() < deadline) {
    const received = await unary(broker, 'ReceiveMessages', {
      consumer_group: args.consumer_group, topic: args.topic, queue_id: -1, filter_expression: '*',
      max_messages: 16, invisible_duration_seconds: 10, long_polling_timeout_seconds: 2,
    });
    for (const d of received.messages) {
      emit('received', {
        message_id: d.message.message_id, body: d.message.body.toString(), transaction_id: d.transaction_id,
        tag: d.message.tag, keys: d.message.keys, properties: d.message.properties,
        delivery_attempt: d.delivery_attempt,
      });
      const acked = await unary(broker, 'AckMessages', {
        consumer_group: args.consumer_group, topic: args.topic, receipt_handles: [d.receipt_handle],
      });
      emit('acked', { code: acked.entries[0].code });
      return;
    }
  }
  throw new Error('no message received within 30 s');
}

const scenarios = { flow };

scenarios[process.argv[2]](JSON.parse(process.argv[3])).then(
  () => process.exit(0),
  (err) => { process.stderr.write(`${err && err.stack || err}\n`); process.exit(1); });
