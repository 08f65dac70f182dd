// Drives the official RocketMQ 5 Node.js client (rocketmq-client-nodejs, unmodified)
// against a txmq proxy. Run by tests/proxy as: node rmq_node.js SCENARIO '{"endpoints": ...}'
// Prints JSON lines ({"event": ...}) on stdout. Its log goes under $HOME/logs/rocketmq/.
'use strict';

const { Producer, SimpleConsumer, PushConsumer, ConsumeResult, FilterExpression } = require('rocketmq-client-nodejs');
const { FilterType } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

function emit(event, fields) {
  process.stdout.write(JSON.stringify({ event, ...(fields || {}) }) + '\n');
}

function view(m) {
  return {
    message_id: m.messageId, topic: m.topic, body: m.body.toString(), tag: m.tag || '',
    keys: [...(m.keys || [])].sort(), properties: Object.fromEntries(m.properties || new Map()),
    delivery_attempt: m.deliveryAttempt, corrupted: m.corrupted,
    delivery_timestamp: m.deliveryTimestamp ? m.deliveryTimestamp.getTime() : null, received_ms: Date.now(),
    message_group: m.messageGroup || '',
  };
}

const checker = {
  async check(m) {
    const rollback = m.body.toString().startsWith('rollback');
    emit('checked', { resolution: rollback ? 'ROLLBACK' : 'COMMIT', ...view(m) });
    return rollback ? TransactionResolution.ROLLBACK : TransactionResolution.COMMIT;
  },
};

// The access key and secret the client signs its requests with (none by default).
function credentials(args) {
  return args.access_key ? { sessionCredentials: { accessKey: args.access_key, accessSecret: args.secret } } : {};
}

// Every client's options: the access point, the namespace, the credentials, and TLS
// (`tls`: sslEnabled, trusting Node's CAs, which NODE_EXTRA_CA_CERTS extends).
function connection(args) {
  return { endpoints: args.endpoints, namespace: args.namespace || '', sslEnabled: args.tls === true, ...credentials(args) };
}

async function transactional(args) {
  const producer = new Producer({ ...connection(args), topics: [args.topic], checker });
  await producer.startup();
  try {
    let i = 0;
    for (const body of args.bodies) {
      const tx = producer.beginTransaction();
      const receipt = await producer.send({
        topic: args.topic, tag: 'TagA', keys: [`k${i}`], body: Buffer.from(body),
        properties: new Map([['n', String(i)]]),
      }, tx);
      emit('sent', { message_id: receipt.messageId, transaction_id: receipt.transactionId, body });
      if (body.startsWith('rollback')) await tx.rollback(); else await tx.commit();
      emit('ended', { message_id: receipt.messageId, body });
      i += 1;
    }
  } finally {
    await producer.shutdown();
  }
  emit('done');
}

// Normal messages; with `delay_ms` each is a delay message due that long after its send;
// with `groups` each is a FIFO message of that message group.
async function send(args) {
  const producer = new Producer({ ...connection(args), topics: [args.topic] });
  await producer.startup();
  try {
    for (const [i, body] of args.bodies.entries()) {
      const due = args.delay_ms ? Date.now() + args.delay_ms : null;
      const receipt = await producer.send({
        topic: args.topic, tag: 'TagA', body: Buffer.from(body),
        ...(due ? { deliveryTimestamp: new Date(due) } : {}),
        ...(args.groups ? { messageGroup: args.groups[i] } : {}),
      });
      emit('sent', { message_id: receipt.messageId, body, due_ms: due });
    }
  } finally {
    await producer.shutdown();
  }
  emit('done');
}

// Sends one half message and dies (SIGKILL) before deciding it: an orphan for the checker.
async function orphan(args) {
  const producer = new Producer({ ...connection(args), topics: [args.topic], checker });
  await producer.startup();
  const tx = producer.beginTransaction();
  const receipt = await producer.send({
    topic: args.topic, tag: 'TagA', keys: ['orphan'], body: Buffer.from(args.body),
  }, tx);
  emit('sent', { message_id: receipt.messageId, transaction_id: receipt.transactionId, body: args.body });
  process.kill(process.pid, 'SIGKILL');
}

// A transactional producer that only answers orphan checks (through `checker`), until
// stdin closes.
async function checkerOnly(args) {
  const producer = new Producer({ ...connection(args), topics: [args.topic], checker });
  await producer.startup();
  emit('started');
  await new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.on('error', resolve);
    process.stdin.resume();
  });
  await producer.shutdown();
  emit('done');
}

// Receives until `count` acknowledgements; "postpone*" bodies get changeInvisibleDuration
// on their first delivery and are acknowledged when redelivered. `sql`: `filter` is SQL92.
async function simple(args) {
  const filter = args.sql ? new FilterExpression(args.filter, FilterType.SQL) : (args.filter || '*');
  const consumer = new SimpleConsumer({
    ...connection(args), consumerGroup: args.group,
    subscriptions: new Map([[args.topic, filter]]), awaitDuration: (args.await_seconds || 2) * 1000,
  });
  await consumer.startup();
  let acked = 0;
  const deadline = Date.now() + (args.timeout_seconds || 60) * 1000;
  try {
    while (acked < args.count && Date.now() < deadline) {
      const messages = await consumer.receive(16, (args.invisible_seconds || 10) * 1000);
      for (const m of messages) {
        emit('received', view(m));
        if (m.body.toString().startsWith('postpone') && m.deliveryAttempt === 1) {
          await consumer.changeInvisibleDuration(m, (args.postpone_seconds || 1) * 1000);
          emit('postponed', { message_id: m.messageId });
          continue;
        }
        await consumer.ack(m);
        acked += 1;
        emit('acked', { message_id: m.messageId });
      }
    }
  } finally {
    await consumer.shutdown();
  }
  emit('done', { acked });
}

// A push consumer until stdin closes: "fail*" bodies fail (FIFO: retried locally, then
// forwarded to the dead-letter queue), the others succeed.
async function push(args) {
  const consumer = new PushConsumer({
    ...connection(args), consumerGroup: args.group,
    subscriptions: new Map([[args.topic, '*']]),
    messageListener: {
      async consume(m) {
        const failed = m.body.toString().startsWith('fail');
        emit('consumed', { result: failed ? 'FAILURE' : 'SUCCESS', ...view(m) });
        return failed ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  emit('started');
  await new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.on('error', resolve);
    process.stdin.resume();
  });
  await consumer.shutdown();
  emit('done');
}

const scenarios = { transactional, send, simple, orphan, checker: checkerOnly, push };

scenarios[process.argv[2]](JSON.parse(process.argv[3])).then(
  () => process.exit(0),
  (err) => { process.stderr.write(`${err && err.stack || err}\n`); process.exit(1); });
