// The Stripe sync engine's side of `inboxctl bench --peer` (docs/benchmarks.md, "Beside the
// Stripe sync engine"): @supabase/stripe-sync-engine at the version package-lock.json pins,
// driven the way its README shows, on a database the bench names. One mode per process:
//
//   node drive.js migrate   the engine's own migrations (its `stripe` schema)
//   node drive.js inproc    processWebhook from PEER_CONCURRENCY callers in this process
//   node drive.js serve     a minimal node http server calling processWebhook per POST
//   node drive.js send      PEER_CONCURRENCY callers POSTing each delivery to PEER_URL
//
// Deliveries come from PEER_FILE, one JSON object a line: {"body": "...", "signature": "t=…,v1=…"}
// as Stripe signs them. Timed modes print "start" when their clock starts and then one JSON
// line with what they measured; `serve` prints "listening <port>" and runs until killed.
'use strict';

const fs = require('node:fs');
const http = require('node:http');
const { StripeSync, runMigrations } = require('@supabase/stripe-sync-engine');

const env = (name) => {
  const value = process.env[name];
  if (value === undefined || value === '') {
    console.error(`drive.js: ${name} is not set`);
    process.exit(2);
  }
  return value;
};

function deliveries() {
  return fs
    .readFileSync(env('PEER_FILE'), 'utf8')
    .split('\n')
    .filter((line) => line.length > 0)
    .map((line) => JSON.parse(line));
}

function engine(connections) {
  return new StripeSync({
    poolConfig: { connectionString: env('PEER_DATABASE_URL'), max: connections },
    // Never called: no object is refetched and no related entity backfilled.
    stripeSecretKey: 'sk_test_peer_bench',
    stripeWebhookSecret: env('PEER_SECRET'),
    stripeApiVersion: '2023-10-16',
    backfillRelatedEntities: false,
    autoExpandLists: false,
  });
}

// Runs `work` over `items` from `concurrency` callers; counts what resolved and what threw.
async function run(items, concurrency, work) {
  let next = 0;
  const counts = { ok: 0, failed: 0, first_error: null };
  const started = process.hrtime.bigint();
  const cpu = process.cpuUsage();
  console.log('start');
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < items.length) {
        const item = items[next++];
        try {
          await work(item);
          counts.ok += 1;
        } catch (e) {
          counts.failed += 1;
          counts.first_error ??= String(e && e.message ? e.message : e).slice(0, 300);
        }
      }
    }),
  );
  const secs = Number(process.hrtime.bigint() - started) / 1e9;
  const used = process.cpuUsage(cpu);
  return { secs, ...counts, cpu_ms: (used.user + used.system) / 1000 };
}

async function main() {
  const mode = process.argv[2];
  const concurrency = Number(process.env.PEER_CONCURRENCY || '4');
  if (mode === 'migrate') {
    await runMigrations({ databaseUrl: env('PEER_DATABASE_URL'), schema: 'stripe' });
    console.log('migrated');
  } else if (mode === 'inproc') {
    const sync = engine(concurrency);
    const items = deliveries().map((d) => ({ body: Buffer.from(d.body), signature: d.signature }));
    const result = await run(items, concurrency, (d) => sync.processWebhook(d.body, d.signature));
    console.log(JSON.stringify(result));
    await sync.postgresClient.pool.end();
  } else if (mode === 'serve') {
    const sync = engine(concurrency);
    const server = http.createServer((req, res) => {
      const chunks = [];
      req.on('data', (c) => chunks.push(c));
      req.on('end', () => {
        sync
          .processWebhook(Buffer.concat(chunks), req.headers['stripe-signature'])
          .then(() => {
            res.writeHead(200, { 'content-type': 'application/json' });
            res.end('{"received":true}');
          })
          .catch((e) => {
            res.writeHead(400, { 'content-type': 'application/json' });
            res.end(JSON.stringify({ error: String(e && e.message ? e.message : e) }));
          });
      });
    });
    server.keepAliveTimeout = 60000;
    server.listen(Number(env('PEER_PORT')), '127.0.0.1', () => {
      console.log(`listening ${server.address().port}`);
    });
  } else if (mode === 'send') {
    const url = new URL(env('PEER_URL'));
    const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
    const items = deliveries();
    const post = (d) =>
      new Promise((resolve, reject) => {
        const req = http.request(
          {
            agent,
            host: url.hostname,
            port: url.port,
            path: url.pathname,
            method: 'POST',
            headers: {
              'content-type': 'application/json',
              'content-length': Buffer.byteLength(d.body),
              'stripe-signature': d.signature,
            },
          },
          (res) => {
            const chunks = [];
            res.on('data', (c) => chunks.push(c));
            res.on('end', () =>
              res.statusCode < 300
                ? resolve()
                : reject(new Error(`${res.statusCode} ${Buffer.concat(chunks).toString().slice(0, 200)}`)),
            );
          },
        );
        req.on('error', reject);
        req.end(d.body);
      });
    const result = await run(items, concurrency, post);
    console.log(JSON.stringify(result));
    agent.destroy();
  } else {
    console.error('drive.js: mode is one of migrate, inproc, serve, send');
    process.exit(2);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
