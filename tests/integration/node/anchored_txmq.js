// An anchored transaction from Node.js, following protos/txmq/v1/DECISIONS.md: the decision
// row in PostgreSQL (the `pg` package) and the half message through a txmq client generated
// at run time from protos/txmq/v1 (@grpc/proto-loader, @grpc/grpc-js). No txmq SDK.
// Run by tests/integration/test_anchored_node.py as:
//   node anchored_txmq.js '{"nameserver": "host:port", "dsn": "postgres://...", "topic": ..., "group": ...,
//                           "order": "o1", "die": "" | "open" | "committed",
//                           "app": "" | "fails" | "commits-inside" | "rolls-back-inside"}'
// "die": SIGKILL itself with the local transaction open after its half was stored ("open"),
// or after the local COMMIT before any EndTransaction ("committed"): another instance of the
// group, or the checker's resolver, decides from the decisions table.
// "app": how the application's own work behaves. "fails": its statement raises (the block
// rolls back, DECISIONS.md step 4); "commits-inside" / "rolls-back-inside": it ends the local
// transaction itself inside the block and goes on (step 5's statement then refuses to decide,
// and the row decides, read from this client's connection).
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

// The halves' EndTransaction (retried for a few seconds: a hint, the check covers a lost one).
async function endAll(broker, group, ids, resolution) {
  const states = [];
  for (const id of ids) {
    let state = '';
    for (let attempt = 0; attempt < 5 && !state; attempt++) {
      try {
        state = (await unary(broker, 'EndTransaction', {
          transaction_id: id, resolution, source: 'TRANSACTION_SOURCE_CLIENT', producer_group: group,
        })).state;
      } catch (err) {
        if (attempt === 4) throw err;
        await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
      }
    }
    states.push(state);
  }
  return states;
}

// DECISIONS.md step 6: the halves committed on the broker, then the row deleted.
async function acknowledge(db, broker, group, key, ids) {
  const states = await endAll(broker, group, ids, 'TRANSACTION_RESOLUTION_COMMIT');
  if (states.every((s) => s === 'TRANSACTION_STATE_COMMITTED')) {
    await db.query(`DELETE FROM ${TABLE} WHERE producer_group = $1 AND decision = 'commit' AND transaction_key = $2`,
                   [group, key]);
  }
  return states;
}

// The local transaction ended otherwise than by step 5's COMMIT: the row decides, read from this
// client's own connection, each statement on its own (autocommit). A `commit` row listing no
// halves was committed by the application inside the block: it records them and they commit.
// None: after the block's own rollback (step 4) nothing can commit the key any more, so the
// halves roll back; after the application ended its transaction inside the block (step 5), the
// key is fenced first, as a check would.
async function settle(db, broker, group, key, ids, fence) {
  const adopted = await db.query(
    `UPDATE ${TABLE} SET transaction_ids = $1 WHERE producer_group = $2 AND transaction_key = $3 ` +
    `AND decision = 'commit' AND transaction_ids IS NULL RETURNING decision`, [ids, group, key]);
  if (adopted.rowCount === 1) {
    return { decided: 'commit', states: await acknowledge(db, broker, group, key, ids) };
  }
  if (fence) {
    const fenced = await db.query(
      `INSERT INTO ${TABLE} (producer_group, transaction_key, decision) SELECT $1, $2, 'rollback' ` +
      `FROM (SELECT set_config('lock_timeout', '500', true), set_config('synchronous_commit', 'on', true)) ` +
      `AS bounds ON CONFLICT (producer_group, transaction_key) DO NOTHING RETURNING decision`, [group, key]);
    if (fenced.rowCount !== 1) {
      const row = await db.query(`SELECT decision FROM ${TABLE} WHERE producer_group = $1 AND transaction_key = $2`,
                                 [group, key]);
      if (row.rowCount !== 1 || row.rows[0].decision !== 'rollback') {
        return { decided: 'left to the checks', states: [] };
      }
    }
  }
  return { decided: 'rollback', states: await endAll(broker, group, ids, 'TRANSACTION_RESOLUTION_ROLLBACK') };
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
  let failure = null;
  try {
    await db.query('INSERT INTO orders (id, body) VALUES ($1, $2)', [args.order, Buffer.from('x')]);
    if (args.app === 'fails') throw new Error('the application failed');
    if (args.app === 'commits-inside') await db.query('COMMIT');
    if (args.app === 'rolls-back-inside') await db.query('ROLLBACK');
  } catch (err) {
    failure = err;
  }

  // 4. The half's durable acknowledgement, before the COMMIT.
  let sent;
  try {
    sent = await half;
  } catch (err) {
    await db.query('ROLLBACK');  // nothing stored: nothing to end; the row went with the rollback
    emit('half_failed', { error: err.message });
    await db.end();
    return;
  }
  emit('half', { transaction_id: sent.transaction_id, key });
  if (args.die === 'open') die();
  const ids = [sent.transaction_id];
  if (failure !== null) {
    await db.query('ROLLBACK');
    const settled = await settle(db, broker, args.group, key, ids, false);
    emit('rolled_back', { error: failure.message, ...settled });
    await db.end();
    return;
  }

  // 5. The halves recorded on the row this transaction inserted (xmin), then the COMMIT: the
  // decision. The statement fails unless that row is there (DECISIONS.md step 5), so a COMMIT
  // never decides for a row the application committed or rolled back earlier.
  try {
    await db.query(`WITH mine AS (UPDATE ${TABLE} SET transaction_ids = $1 WHERE producer_group = $2 ` +
                   `AND transaction_key = $3 AND decision = 'commit' AND xmin = pg_current_xact_id()::xid ` +
                   `RETURNING 1) SELECT CASE count(*) WHEN 1 THEN NULL ` +
                   `ELSE (count(*) || ' decision rows inserted by this transaction')::int END FROM mine`,
                   [ids, args.group, key]);
  } catch (err) {
    if (err.code !== '22P02') throw err;
    // Ended inside the block: no COMMIT of this client decides. Whatever the statement opened
    // is rolled back (nothing, on a connection outside a transaction), and the row decides.
    await db.query('ROLLBACK');
    const settled = await settle(db, broker, args.group, key, ids, true);
    emit('ended_inside', settled);
    await db.end();
    return;
  }
  await db.query('COMMIT');
  emit('committed', { order: args.order });
  if (args.die === 'committed') die();

  // 6. EndTransaction as a hint; the row goes once the broker has the COMMIT.
  const states = await acknowledge(db, broker, args.group, key, ids);
  emit('ended', { state: states[0] });
  await db.end();
}

main(JSON.parse(process.argv[2])).then(
  () => process.exit(0),
  (err) => { process.stderr.write(`${err.stack || err}\n`); process.exit(1); });
