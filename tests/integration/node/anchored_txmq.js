// An anchored transaction from Node.js, following protos/txmq/v1/DECISIONS.md: the decision
// row in PostgreSQL (the `pg` package) and the half message through a txmq client generated
// at run time from protos/txmq/v1 (@grpc/proto-loader, @grpc/grpc-js). No txmq SDK.
// Run by tests/integration/test_anchored_node.py as:
//   node anchored_txmq.js '{"nameserver": "host:port", "dsn": "postgres://...", "topic": ..., "group": ...,
//                           "order": "o1", "die": "" | "open" | "committed"}'
// "die": SIGKILL itself with the local transaction open after its half was stored ("open"),
// or after the local COMMIT before any EndTransaction ("committed"): another instance of the
// group, or the checker's resolver, decides from the decisions table.
'use strict';

const path = require('path');
const crypto = require('crypto');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { Client } = require('pg');

const PROTOS = path.resolve(__dirname, '..', '..', '..', 'protos');
const TABLE = 'txmq_decisions';

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

function die() {
  process.kill(process.pid, 'SIGKILL');
}

async function main(args) {
  const v1 = load();
  const insecure = grpc.credentials.createInsecure();
  const db = new Client({ connectionString: args.dsn });
  await db.connect();
  const key = crypto.randomBytes(16).toString('hex');

  // 1. The decision row, first statement of the local transaction (its lock held until the end).
  await db.query('BEGIN');
  await db.query(
    `INSERT INTO ${TABLE} (producer_group, transaction_key, decision) SELECT $1, $2, 'commit' ` +
    `FROM (SELECT set_config('synchronous_commit', 'on', true), ` +
    `set_config('idle_in_transaction_session_timeout', '60000', true), ` +
    `set_config('statement_timeout', '300000', true)) AS bounds`, [args.group, key]);

  // 2. Only then the half message, stamped with the key.
  const nameserver = new v1.NameServerService(args.nameserver, insecure);
  const route = await unary(nameserver, 'QueryRoute', { topic: args.topic, for_send: true });
  const queue = route.queues[0];
  const broker = new v1.BrokerService(queue.broker_address, insecure);
  const half = unary(broker, 'SendMessage', { message: {
    topic: args.topic, body: Buffer.from(args.order), message_id: `node-${crypto.randomBytes(12).toString('hex')}`,
    type: 'MESSAGE_TYPE_TRANSACTION', producer_group: args.group, producer_client_id: 'node-anchored',
    queue_id: queue.queue_id, properties: { __TXMQ_TRANSACTION_KEY: key, __TXMQ_ANCHOR: '1' },
  } });

  // 3. The application's work, while the half travels.
  await db.query('INSERT INTO orders (id, body) VALUES ($1, $2)', [args.order, Buffer.from('x')]);

  // 4. The half's durable acknowledgement, before the COMMIT.
  const sent = await half;
  emit('half', { transaction_id: sent.transaction_id, key });
  if (args.die === 'open') die();

  // 5. The halves recorded on the row this transaction inserted (xmin), then the COMMIT: the
  // decision. The statement fails unless that row is there (DECISIONS.md step 5), so a COMMIT
  // never decides for a row the application committed or rolled back earlier.
  await db.query(`WITH mine AS (UPDATE ${TABLE} SET transaction_ids = $1 WHERE producer_group = $2 ` +
                 `AND transaction_key = $3 AND decision = 'commit' AND xmin = pg_current_xact_id()::xid ` +
                 `RETURNING 1) SELECT CASE count(*) WHEN 1 THEN NULL ` +
                 `ELSE (count(*) || ' decision rows inserted by this transaction')::int END FROM mine`,
                 [[sent.transaction_id], args.group, key]);
  await db.query('COMMIT');
  emit('committed', { order: args.order });
  if (args.die === 'committed') die();

  // 6. EndTransaction as a hint; the row goes once the broker has the COMMIT.
  const ended = await unary(broker, 'EndTransaction', {
    transaction_id: sent.transaction_id, resolution: 'TRANSACTION_RESOLUTION_COMMIT',
    source: 'TRANSACTION_SOURCE_CLIENT', producer_group: args.group,
  });
  if (ended.state === 'TRANSACTION_STATE_COMMITTED') {
    await db.query(`DELETE FROM ${TABLE} WHERE producer_group = $1 AND decision = 'commit' AND transaction_key = $2`,
                   [args.group, key]);
  }
  emit('ended', { state: ended.state });
  await db.end();
}

main(JSON.parse(process.argv[2])).then(
  () => process.exit(0),
  (err) => { process.stderr.write(`${err.stack || err}\n`); process.exit(1); });
