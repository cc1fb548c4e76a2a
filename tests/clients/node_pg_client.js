// node-postgres (`pg`) against pgdp: connect, a parameterised DP query (unnamed and named
// prepared statements), and a refusal with its SQLSTATE. Prints `ok <check> <detail>` or
// `FAIL <check>: <error>` per check, as tests/clients/matrix.py does; tests/integration/clients.rs reads them.
'use strict';

const { Client } = require('pg');

const REGIONS = ['CE', 'EA', 'IS', 'NE', 'NO', 'NW', 'SE', 'SO', 'SW', 'WE'];

function config() {
  return {
    host: process.env.PGDP_HOST || '127.0.0.1',
    port: Number(process.env.PGDP_PORT || 6432),
    user: process.env.PGDP_USER || 'analyst',
    password: process.env.PGDP_PASSWORD || 'analyst',
    database: process.env.PGDP_DATABASE || 'pgdp_demo',
    ssl: false,
    connectionTimeoutMillis: 10000,
  };
}

function assert(cond, message) {
  if (!cond) throw new Error(message);
}

async function withClient(fn) {
  const client = new Client(config());
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

const checks = {
  connect: () => withClient(async (c) => {
    const r = await c.query('SELECT current_user');
    assert(r.rows[0].current_user === config().user, JSON.stringify(r.rows));
    const v = await c.query('SHOW server_version');
    return `server_version=${v.rows[0].server_version}`;
  }),
  parameterised_dp_query: () => withClient(async (c) => {
    const r = await c.query('SELECT COUNT(*) AS n FROM demo.people WHERE age >= $1', [0]);
    // int8 arrives as a string in node-postgres.
    const n = Number(r.rows[0].n);
    assert(n >= 99000 && n <= 101000, `count ${r.rows[0].n}`);
    assert(r.fields[0].dataTypeID === 20, `count type OID ${r.fields[0].dataTypeID}`);
    const named = { name: 'people_by_sex', text: 'SELECT region, COUNT(*) AS n FROM demo.people WHERE sex = $1 GROUP BY region', values: ['F'] };
    const a = await c.query(named);
    const b = await c.query(named);
    assert(a.rows.map((x) => x.region).sort().join() === REGIONS.join(), JSON.stringify(a.rows));
    assert(JSON.stringify(a.rows) === JSON.stringify(b.rows), 'named statement answered differently');
    return `count=${n} groups=${a.rows.length}`;
  }),
  // PostgreSQL types an integer literal as int4, which node-postgres returns as a number.
  constant_select_int4: () => withClient(async (c) => {
    const r = await c.query('SELECT 1 AS one');
    assert(r.fields[0].dataTypeID === 23, `type OID ${r.fields[0].dataTypeID}, expected 23 (int4)`);
    assert(r.rows[0].one === 1, JSON.stringify(r.rows));
    return 'int4';
  }),
  refusal: () => withClient(async (c) => {
    try {
      await c.query('SELECT * FROM demo.people WHERE age > $1', [1]);
    } catch (e) {
      assert(e.code === '42501', `SQLSTATE ${e.code}`);
      const r = await c.query('SELECT 1 AS one');
      assert(String(r.rows[0].one) === '1', JSON.stringify(r.rows));
      return `42501`;
    }
    throw new Error('no refusal');
  }),
};

(async () => {
  const wanted = process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(checks);
  let failed = false;
  for (const name of wanted) {
    try {
      if (!checks[name]) throw new Error('no such check');
      const detail = await checks[name]();
      console.log(`ok ${name}${detail ? ` ${detail}` : ''}`);
    } catch (e) {
      failed = true;
      console.log(`FAIL ${name}: ${String(e && e.stack || e).replace(/\n/g, ' | ')}`);
    }
  }
  process.exit(failed ? 1 : 0);
})();
