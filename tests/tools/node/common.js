// What the ORM programs of this directory share (sequelize.js, knex.js, prisma.js; run by
// tests/integration/tools_node.rs):
//
// - where to connect: pgdp from PGDP_HOST/PORT/USER/PASSWORD/DATABASE, and the upstream
//   PostgreSQL that holds the demo data from UPSTREAM_HOST/PORT/USER/PASSWORD/DATABASE;
// - a tap on node-postgres (`pg.Client.prototype.query`, which all three ORMs go through): for
//   every statement it records the SQL text, the bound values, the result's field type OIDs and
//   the server's error (SQLSTATE, message, hint), and which server it went to;
// - the check runner: each check runs one ORM operation against the upstream (PostgreSQL's
//   answer) and then against pgdp, and prints one line,
//     `ok <check> types=… js=… <plausibility> sql: …` or
//     `FAIL <check>: sqlstate=XXXXX <message> …` (pgdp refused; the SQLSTATE comes from the
//                                                   server's ErrorResponse),
//     `FAIL <check>: mismatch …` (answered, but with other field types or JS types than
//                                 PostgreSQL's, or another catalog fact),
//     `FAIL <check>: implausible …` (a value outside its plausibility range),
//     `FAIL <check>: error …` (anything else: an ORM error without a server error).
//   Every statement of a check goes to standard error in full, as JSON.
//
// DP answers are noisy: checks compare them with the upstream's exact answer within a tolerance,
// never exactly. Standard output carries only the check lines.
'use strict';

const pg = require('pg');
const { prepareValue } = require('pg/lib/utils');

function pgdpConfig() {
  return {
    host: process.env.PGDP_HOST || '127.0.0.1',
    port: Number(process.env.PGDP_PORT || 6432),
    user: process.env.PGDP_USER || 'analyst',
    password: process.env.PGDP_PASSWORD || 'analyst',
    database: process.env.PGDP_DATABASE || 'pgdp_demo',
  };
}

function upstreamConfig() {
  return {
    host: process.env.UPSTREAM_HOST || '127.0.0.1',
    port: Number(process.env.UPSTREAM_PORT || 5432),
    user: process.env.UPSTREAM_USER || 'postgres',
    password: process.env.UPSTREAM_PASSWORD || '',
    database: process.env.UPSTREAM_DATABASE || 'pgdp_demo',
  };
}

/** Connection settings of `target` ('pgdp' or 'upstream'). */
function config(target) {
  return target === 'pgdp' ? pgdpConfig() : upstreamConfig();
}

// ---------------------------------------------------------------------------------------------
// The tap on node-postgres.

const statements = [];

function recordResult(entry, err, res) {
  if (err) {
    entry.error = { code: err.code, message: err.message, hint: err.hint };
    return;
  }
  const results = Array.isArray(res) ? res : [res];
  entry.oids = results.map((r) => (r && r.fields ? r.fields.map((f) => f.dataTypeID) : []));
  entry.rows = results.reduce((n, r) => n + (r && r.rows ? r.rows.length : 0), 0);
}

function installTap() {
  const original = pg.Client.prototype.query;
  if (original.pgdpTap) return;
  const pgdpPort = pgdpConfig().port;
  const tapped = function query(config, values, callback) {
    // Submittables (cursors, streams) are not used by the ORMs' calls here; pass them through.
    if (config && typeof config.submit === 'function') return original.apply(this, arguments);
    const text = typeof config === 'string' ? config : config && config.text;
    const bound = Array.isArray(values) ? values : config && config.values;
    const entry = {
      target: Number(this.port) === pgdpPort ? 'pgdp' : 'upstream',
      sql: text,
      values: bound && bound.length ? bound.map(showValue) : undefined,
    };
    statements.push(entry);
    const args = Array.from(arguments);
    const at = typeof values === 'function' ? 1 : typeof callback === 'function' ? 2 : -1;
    if (at >= 0) {
      const cb = args[at];
      args[at] = (err, res) => {
        recordResult(entry, err, res);
        cb(err, res);
      };
      return original.apply(this, args);
    }
    return original.apply(this, args).then(
      (res) => {
        recordResult(entry, null, res);
        return res;
      },
      (err) => {
        recordResult(entry, err);
        throw err;
      },
    );
  };
  tapped.pgdpTap = true;
  pg.Client.prototype.query = tapped;
}

/** A bound value as the log shows it; a Date with the text node-postgres sends for it. */
function showValue(v) {
  if (v instanceof Date) return `Date ${v.toISOString()} sent as '${prepareValue(v)}'`;
  if (typeof v === 'bigint') return `${v}n`;
  if (Buffer.isBuffer(v)) return `Buffer(${v.length})`;
  return v;
}

// ---------------------------------------------------------------------------------------------
// The JS types an application sees.

/** The JS type of a value, recursively: `{n:string}`, `[{region:string,n:BigInt}]`, … */
function jsType(v) {
  if (v === null) return 'null';
  if (v === undefined) return 'undefined';
  if (typeof v === 'bigint') return 'BigInt';
  if (v instanceof Date) return 'Date';
  if (Buffer.isBuffer(v)) return 'Buffer';
  // Prisma's Decimal (decimal.js; its class name is not kept in Prisma 7's bundle).
  if (typeof v === 'object' && typeof v.toNumber === 'function' && typeof v.toFixed === 'function') return 'Decimal';
  if (Array.isArray(v)) return `[${[...new Set(v.map(jsType))].join('|')}]`;
  if (typeof v === 'object') {
    // Sequelize model instances: their attributes.
    const plain = v.constructor !== Object && typeof v.get === 'function' ? v.get({ plain: true }) : v;
    return `{${Object.keys(plain).sort().map((k) => `${k}:${jsType(plain[k])}`).join(',')}}`;
  }
  return typeof v;
}

// ---------------------------------------------------------------------------------------------
// Plausibility of noisy answers.

class Implausible extends Error {}

/** An answer that differs from PostgreSQL's in what it says (not noise): a catalog fact. */
class Mismatch extends Error {}

/** A number from a count, sum or average in any of the ORMs' representations. */
function num(v) {
  if (v === null || v === undefined) throw new Implausible(`no value (${v})`);
  return Number(typeof v === 'object' ? v.toString() : v);
}

/** `dp` within `rel` (relative) or `abs` of the upstream's `truth`; returns a short note. */
function near(label, dp, truth, rel = 0.02, abs = 0) {
  const [d, t] = [num(dp), num(truth)];
  const tolerance = Math.max(Math.abs(t) * rel, abs);
  if (!(Math.abs(d - t) <= tolerance)) {
    throw new Implausible(`${label} = ${d}, upstream ${t}, allowed ±${tolerance}`);
  }
  return `${label}=${round(d)}~${round(t)}`;
}

function round(x) {
  return Math.abs(x) >= 100 ? Math.round(x) : Math.round(x * 100) / 100;
}

/** Rows keyed by `key`: the same keys in pgdp's answer as upstream, each `fields` near. */
function groupsNear(dpRows, truthRows, key, fields, rel = 0.02, abs = 0) {
  const dp = new Map(dpRows.map((r) => [String(r[key]), r]));
  const truth = new Map(truthRows.map((r) => [String(r[key]), r]));
  const dk = [...dp.keys()].sort().join(',');
  const tk = [...truth.keys()].sort().join(',');
  if (dk !== tk) throw new Implausible(`groups ${dk}, upstream ${tk}`);
  for (const [k, t] of truth) {
    for (const f of fields) near(`${k}.${f}`, dp.get(k)[f], t[f], rel, abs);
  }
  return `groups=${dk}`;
}

/** The same rows (public tables: exact). */
function sameRows(dp, truth) {
  const [d, t] = [JSON.stringify(plain(dp)), JSON.stringify(plain(truth))];
  if (d !== t) throw new Implausible(`rows ${d.slice(0, 300)}, upstream ${t.slice(0, 300)}`);
  return `rows=${Array.isArray(dp) ? dp.length : 1}`;
}

function plain(v) {
  return JSON.parse(JSON.stringify(v, (_, x) => (typeof x === 'bigint' ? `${x}n` : x)));
}

// ---------------------------------------------------------------------------------------------
// The check runner.

/**
 * A check of one ORM operation: `op(target)` runs it against 'upstream' or 'pgdp' and returns
 * what the application gets; `verify(dp, truth, reference)` checks pgdp's answer against
 * PostgreSQL's and returns a note (or throws Implausible). `reference`, when given, is SQL run
 * directly on the upstream whose rows `verify` gets as its third argument: the exact value of
 * the statistic pgdp estimates where that is not the plain SQL answer (pgdp clamps values into
 * the policy's bounds and caps each person's rows, see REFERENCE).
 */
function check(op, verify, reference) {
  return { op, verify, reference };
}

/**
 * The statistics pgdp estimates, exactly, where the policy (policies/demo.yaml) makes them differ
 * from the plain SQL answer: `income` is clamped into [0, 250000] before SUM and AVG (the demo's
 * CHECK keeps it >= 0), and MIN and MAX are percentiles. A COUNT over demo.visits is compared
 * with PostgreSQL's own answer: the demo chooses each query's cap on visits per person
 * (choose_bounds, up to every visit of the heaviest users), so it estimates the plain count.
 */
const REFERENCE = {
  income: 'SELECT COUNT(*) AS n, SUM(LEAST(income, 250000)) AS total, AVG(LEAST(income, 250000)) AS mean_income FROM demo.people',
  incomeAdults: 'SELECT COUNT(*) AS n, AVG(LEAST(income, 250000)) AS mean_income FROM demo.people WHERE age >= 18',
  incomeByRegion: 'SELECT region, COUNT(*) AS n, AVG(LEAST(income, 250000)) AS mean_income FROM demo.people GROUP BY region',
  incomeByRegionAdults: 'SELECT region, COUNT(*) AS n, AVG(LEAST(income, 250000)) AS mean_income FROM demo.people WHERE age >= 18 GROUP BY region',
  incomeBySex: 'SELECT sex, SUM(LEAST(income, 250000)) AS total FROM demo.people GROUP BY sex',
  // MIN and MAX are released as the 1st and 99th percentiles (docs/queries.md).
  ageRange: `SELECT PERCENTILE_DISC(0.01) WITHIN GROUP (ORDER BY age) AS min,
    PERCENTILE_DISC(0.99) WITHIN GROUP (ORDER BY age) AS max FROM demo.people`,
  visitsFrom2024: "SELECT COUNT(*) AS n FROM demo.visits WHERE visit_date >= DATE '2024-01-01'",
};

let referencePool;

async function referenceRows(sql) {
  if (!referencePool) referencePool = new pg.Pool({ ...upstreamConfig(), max: 1 });
  return (await referencePool.query(sql)).rows;
}

function sqlOf(entries) {
  return entries
    .map((e) => `${oneLine(e.sql)}${e.values ? ` ${JSON.stringify(e.values)}` : ''}`)
    .join(' ;; ');
}

function oneLine(s) {
  return String(s).replace(/\s+/g, ' ').trim();
}

function typesOf(entries) {
  return entries
    .filter((e) => e.oids)
    .map((e) => `[${e.oids.map((o) => (o.length ? o.join(',') : '-')).join('/')}]`)
    .join(' ');
}

async function runCheck(name, { op, verify, reference }) {
  const start = statements.length;
  let truth;
  try {
    truth = await op('upstream');
  } catch (e) {
    return `FAIL ${name}: error the upstream failed too: ${String(e && e.message).replace(/\n/g, ' ')}`;
  }
  const afterUpstream = statements.length;
  let dp;
  let failure;
  try {
    dp = await op('pgdp');
  } catch (e) {
    failure = e;
  }
  const up = statements.slice(start, afterUpstream).filter((e) => e.target === 'upstream');
  const mine = statements.slice(afterUpstream).filter((e) => e.target === 'pgdp');
  for (const e of mine) process.stderr.write(`${name} ${JSON.stringify(e)}\n`);
  const sql = `sql: ${sqlOf(mine)}`;
  if (failure) {
    const refused = mine.find((e) => e.error && e.error.code);
    if (refused) {
      const { code, message, hint } = refused.error;
      return `FAIL ${name}: sqlstate=${code} ${oneLine(message)}${hint ? ` (hint: ${oneLine(hint)})` : ''} | ${sql}`;
    }
    return `FAIL ${name}: error ${oneLine(failure && failure.stack || failure)} | ${sql}`;
  }
  // An error the tool went on from (PostgreSQL answered the same statement).
  const differ = mine.filter((e) => e.error).map((e) => `refused ${e.error.code} ${oneLine(e.error.message)} (the tool went on) for ${oneLine(e.sql).slice(0, 160)}`);
  // Field types, statement by statement: the same SQL must get the same types.
  const answered = mine.filter((e) => e.oids);
  const expected = up.filter((e) => e.oids);
  for (const e of answered) {
    const u = expected.find((x) => x.sql === e.sql && !x.matched);
    if (!u) {
      differ.push(`no upstream statement like ${oneLine(e.sql).slice(0, 120)}`);
      continue;
    }
    u.matched = true;
    if (JSON.stringify(u.oids) !== JSON.stringify(e.oids)) {
      differ.push(`oids ${JSON.stringify(e.oids)}, PostgreSQL ${JSON.stringify(u.oids)} for ${oneLine(e.sql).slice(0, 160)}`);
    }
  }
  const [dpType, truthType] = [jsType(dp), jsType(truth)];
  if (dpType !== truthType) differ.push(`js ${dpType}, PostgreSQL ${truthType}`);
  if (differ.length) return `FAIL ${name}: mismatch ${differ.join('; ')} | ${sql}`;
  let note;
  try {
    note = verify ? verify(dp, truth, reference ? await referenceRows(reference) : undefined) : '';
  } catch (e) {
    if (e instanceof Implausible) return `FAIL ${name}: implausible ${e.message} | ${sql}`;
    if (e instanceof Mismatch) return `FAIL ${name}: mismatch ${e.message} | ${sql}`;
    return `FAIL ${name}: error ${oneLine(e && e.stack || e)} | ${sql}`;
  }
  return `ok ${name} types=${typesOf(answered) || 'none'} js=${dpType}${note ? ` ${note}` : ''} | ${sql}`;
}

/**
 * Runs the checks named on the command line (all when none is), prints one line each, then
 * `close()`. Exits 0 when every check ran (whatever its outcome: tools_node.rs holds the
 * expectations), 2 when a name is unknown or the program itself broke.
 */
async function main(checks, close) {
  installTap();
  const names = process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(checks);
  let broken = false;
  for (const name of names) {
    if (!checks[name]) {
      console.log(`FAIL ${name}: error no such check`);
      broken = true;
      continue;
    }
    const started = Date.now();
    const line = await runCheck(name, checks[name]);
    process.stderr.write(`${name}: ${Date.now() - started} ms\n`);
    console.log(line);
  }
  try {
    await close();
    if (referencePool) await referencePool.end();
  } catch (e) {
    process.stderr.write(`close: ${e && e.stack || e}\n`);
  }
  process.exit(broken ? 2 : 0);
}

module.exports = {
  REFERENCE,
  config,
  check,
  main,
  near,
  groupsNear,
  sameRows,
  num,
  Implausible,
  Mismatch,
};
