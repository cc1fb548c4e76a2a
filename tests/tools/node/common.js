// What the ORM programs of this directory share (sequelize.js, knex.js, prisma.js; run by
// tests/integration/tools_node.rs):
//
// - where to connect: pgdp from PGDP_HOST/PORT/USER/PASSWORD/DATABASE, and the upstream
//   PostgreSQL that holds the demo data from UPSTREAM_HOST/PORT/USER/PASSWORD/DATABASE;
// - a tap on node-postgres (`pg.Client.prototype.query`, which all three ORMs go through): for
//   every statement it records the SQL text, the bound values, the result's field type OIDs,
//   the server's error (SQLSTATE, message, hint) and NOTICEs, and which server it went to;
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
// - the dashboard runner (PGDP_SYNOPSIS=<name>): a program's counting operations over a synopsis,
//   each `ok` only when answered from the synopsis for no charge after the first and within the
//   bounds its NOTICE states (see "Dashboards over a synopsis" below).
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

function recordResult(client, entry, err, res) {
  const at = client.pgdpPending.indexOf(entry);
  if (at >= 0) client.pgdpPending.splice(at, 1);
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
      notices: [],
    };
    statements.push(entry);
    listenForNotices(this);
    this.pgdpPending.push(entry);
    const args = Array.from(arguments);
    const at = typeof values === 'function' ? 1 : typeof callback === 'function' ? 2 : -1;
    if (at >= 0) {
      const cb = args[at];
      args[at] = (err, res) => {
        recordResult(this, entry, err, res);
        cb(err, res);
      };
      return original.apply(this, args);
    }
    return original.apply(this, args).then(
      (res) => {
        recordResult(this, entry, null, res);
        return res;
      },
      (err) => {
        recordResult(this, entry, err);
        throw err;
      },
    );
  };
  tapped.pgdpTap = true;
  pg.Client.prototype.query = tapped;
}

/**
 * Records the server's NOTICEs on `client` (node-postgres's 'notice' events) with the statement
 * they came with: the oldest one still waiting for its result, as node-postgres runs a client's
 * queries one at a time in order.
 */
function listenForNotices(client) {
  if (client.pgdpPending) return;
  client.pgdpPending = [];
  client.on('notice', (notice) => {
    const entry = client.pgdpPending[0];
    if (entry) entry.notices.push(notice.message);
  });
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

/** The line of a check whose operation failed on pgdp: its SQLSTATE when pgdp refused. */
function failed(name, failure, mine, sql) {
  const refused = mine.find((e) => e.error && e.error.code);
  if (refused) {
    const { code, message, hint } = refused.error;
    return `FAIL ${name}: sqlstate=${code} ${oneLine(message)}${hint ? ` (hint: ${oneLine(hint)})` : ''} | ${sql}`;
  }
  return `FAIL ${name}: error ${oneLine(failure && failure.stack || failure)} | ${sql}`;
}

/**
 * How pgdp's statements `mine` and the answer `dp` differ from the upstream's statements `up`
 * and answer `truth` in what is not noise: an error the tool went on from, the field types of
 * each statement (the same SQL must get the same types), the JS types of the answer.
 */
function typesDiffer(mine, up, dp, truth) {
  const differ = mine.filter((e) => e.error).map((e) => `refused ${e.error.code} ${oneLine(e.error.message)} (the tool went on) for ${oneLine(e.sql).slice(0, 160)}`);
  const expected = up.filter((e) => e.oids);
  for (const e of mine.filter((x) => x.oids)) {
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
  return differ;
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
  if (failure) return failed(name, failure, mine, sql);
  const differ = typesDiffer(mine, up, dp, truth);
  if (differ.length) return `FAIL ${name}: mismatch ${differ.join('; ')} | ${sql}`;
  const [answered, dpType] = [mine.filter((e) => e.oids), jsType(dp)];
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

// ---------------------------------------------------------------------------------------------
// Dashboards over a synopsis.
//
// With PGDP_SYNOPSIS=<name> in its environment a program runs its dashboard over that synopsis
// instead of its checks: the counting operations an application of the tool writes over the
// columns of the synopsis that pgdp's policy declares (private multiplicative weights;
// docs/policy.md, "synopses"), each one check, run against the upstream and then against pgdp.
// A dashboard check is `ok` only when
//   - pgdp's NOTICE says that the answer came from the synopsis
//     (`pgdp: answered from synopsis <name> (…`);
//   - it charged nothing, unless it is the answer that paid for the synopsis (the first of the
//     run, whose NOTICE says it pays, and whose epsilon_spent grows): its NOTICE says so
//     (`pgdp: charged nothing: synopsis <name> was paid for once …`) and the analyst's
//     epsilon_spent, read with SHOW pgdp.budget through the tool's raw-query API before and
//     after the operation, is unchanged;
//   - its field types and JS types are PostgreSQL's for the same operation;
//   - it holds every group PostgreSQL has, in the order the operation asks for, with its counts
//     within the largest 95 % bound that the NOTICE states of PostgreSQL's: a single count must
//     be within, of several at most a tenth may be outside (a count outside its 95 % bound is
//     noise one time in twenty, not a bug).
// An answer of the per-query path is `FAIL <check>: mismatch not answered from the synopsis
// (<its NOTICEs>)`; a refusal, as for the checks, `FAIL <check>: sqlstate=…`.

const SYNOPSIS = process.env.PGDP_SYNOPSIS;

/**
 * A dashboard check: `op(target)` as for `check`; `counts(result)` the counts of a result as
 * [key, count] pairs; `order(result)`, when given, throws Mismatch unless the result is in the
 * order the operation asks for.
 */
function dashboard(op, counts, order) {
  return { op, counts, order };
}

/** A dashboard's reload: the dashboard checks `names` again, none charged. */
function reload(...names) {
  return { reload: names };
}

/** `counts` of an operation that returns one count. */
function single(count) {
  return [['', count]];
}

/** `counts` of grouped rows: each row's values of `keys`, and its count `count(row)`. */
function grouped(keys, count) {
  return (rows) => rows.map((r) => [keys.map((k) => String(r[k])).join('/'), count(r)]);
}

/** `order` of rows sorted by `key(row)`, ascending (descending with `descending`). */
function sortedBy(key, descending = false) {
  return (rows) => {
    const got = rows.map(key);
    const want = [...got].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    if (descending) want.reverse();
    if (JSON.stringify(got) !== JSON.stringify(want)) {
      throw new Mismatch(`not in the order asked for: ${JSON.stringify(got)}`);
    }
  };
}

/** The check of this run whose answer paid for the synopsis: later ones must charge nothing. */
const paid = { by: undefined };

/** The largest 95 % bound (`within <rows> rows`) that a synopsis NOTICE states. */
function statedBound(notice) {
  const bounds = notice.split('within ').slice(1).map((part) => Number(part.split(' ')[0])).filter(Number.isFinite);
  if (!bounds.length) throw new Mismatch(`no bound in the NOTICE ${notice}`);
  return Math.max(...bounds);
}

/** Runs the dashboard check `name`; `budget()` reads pgdp's epsilon_spent through the tool. */
async function runDashboard(name, { op, counts, order }, budget) {
  const start = statements.length;
  let truth;
  try {
    truth = await op('upstream');
  } catch (e) {
    return `FAIL ${name}: error the upstream failed too: ${oneLine(e && e.message)}`;
  }
  const up = statements.slice(start).filter((e) => e.target === 'upstream');
  const before = await budget();
  const afterBudget = statements.length;
  let dp;
  let failure;
  try {
    dp = await op('pgdp');
  } catch (e) {
    failure = e;
  }
  const mine = statements.slice(afterBudget).filter((e) => e.target === 'pgdp');
  const after = await budget();
  for (const e of mine) process.stderr.write(`${name} ${JSON.stringify(e)}\n`);
  const sql = `sql: ${sqlOf(mine)}`;
  if (failure) return failed(name, failure, mine, sql);
  const notices = mine.flatMap((e) => e.notices);
  const said = notices.map((n) => `NOTICE: ${n}`).join(' ;; ') || 'no NOTICE';
  const answered = notices.find((n) => n.startsWith(`pgdp: answered from synopsis ${SYNOPSIS} (`));
  if (!answered) return `FAIL ${name}: mismatch not answered from the synopsis (${said}) | ${sql}`;
  const differ = typesDiffer(mine, up, dp, truth);
  if (differ.length) return `FAIL ${name}: mismatch ${differ.join('; ')} | ${sql}`;

  // The charge: the synopsis's by the answer that pays for it, nothing by any other.
  let charge;
  if (paid.by === undefined && notices.some((n) => n.includes(`that pays for synopsis ${SYNOPSIS} once`))) {
    if (!(after > before)) {
      return `FAIL ${name}: mismatch paid for the synopsis, but epsilon_spent ${before} -> ${after} (${said}) | ${sql}`;
    }
    paid.by = name;
    charge = `paid for the synopsis: epsilon_spent ${before} -> ${after}`;
  } else if (after !== before || !notices.some((n) => n.startsWith(`pgdp: charged nothing: synopsis ${SYNOPSIS} was paid for once`))) {
    return `FAIL ${name}: mismatch charged after the synopsis was paid for (by ${paid.by}): epsilon_spent ${before} -> ${after} (${said}) | ${sql}`;
  } else {
    charge = 'charged nothing';
  }

  // Every group PostgreSQL has, in order, each count within the stated bound of PostgreSQL's.
  try {
    const bound = statedBound(answered);
    const released = counts(dp).map(([k, n]) => [k, num(n)]);
    const exact = new Map(counts(truth).map(([k, n]) => [k, num(n)]));
    const keys = new Set(released.map(([k]) => k));
    const missing = [...exact.keys()].filter((k) => !keys.has(k));
    if (missing.length) throw new Mismatch(`groups ${missing} that PostgreSQL has are missing`);
    const outside = released.filter(([k, n]) => Math.abs(n - (exact.get(k) || 0)) > bound)
      .map(([k, n]) => `${k || 'count'} ${n} (PostgreSQL ${exact.get(k) || 0})`);
    if ((released.length === 1 && outside.length) || outside.length * 10 > released.length) {
      throw new Mismatch(`${outside.length} of ${released.length} counts outside the stated 95 % bound ${bound} of PostgreSQL's: ${outside.join(', ')} (${said})`);
    }
    if (order) order(dp);
    return `ok ${name} from synopsis ${SYNOPSIS}, ${charge}; counts=${released.length} outside=${outside.length} bound=${bound} types=${typesOf(mine) || 'none'} js=${jsType(dp)} | ${sql}`;
  } catch (e) {
    if (e instanceof Mismatch) return `FAIL ${name}: mismatch ${e.message} | ${sql}`;
    return `FAIL ${name}: error ${oneLine(e && e.stack || e)} | ${sql}`;
  }
}

/** Runs the reload `names` of `checks`: ok when each of them is ok again. */
async function runReload(name, names, checks, budget) {
  if (paid.by === undefined) {
    // Run alone: the first answer pays; the reload is what follows it.
    await runDashboard(names[0], checks[names[0]], budget);
  }
  const lines = [];
  for (const again of names) {
    const line = await runDashboard(again, checks[again], budget);
    if (!line.startsWith('ok ')) return line.replace(`FAIL ${again}: `, `FAIL ${name}: `).replace(' | sql:', ` (in ${again} again) | sql:`);
    lines.push(line.slice('ok '.length));
  }
  return `ok ${name} ${lines.join(' || ')}`;
}

/**
 * Runs the checks named on the command line (all when none is), prints one line each, then
 * `close()`. Exits 0 when every check ran (whatever its outcome: tools_node.rs holds the
 * expectations), 2 when a name is unknown or the program itself broke. With PGDP_SYNOPSIS set,
 * the checks are the dashboard `dashboards[PGDP_SYNOPSIS]`: `{ checks, budget }`, where
 * `budget()` reads pgdp's epsilon_spent through the tool.
 */
async function main(checks, close, dashboards = {}) {
  installTap();
  let run = (name) => runCheck(name, checks[name]);
  if (SYNOPSIS) {
    const board = dashboards[SYNOPSIS] || { checks: {} };
    checks = board.checks;
    run = (name) => (checks[name].reload
      ? runReload(name, checks[name].reload, checks, board.budget)
      : runDashboard(name, checks[name], board.budget));
  }
  const names = process.argv.slice(2).length ? process.argv.slice(2) : Object.keys(checks);
  let broken = false;
  for (const name of names) {
    if (!checks[name]) {
      console.log(`FAIL ${name}: error no such check${SYNOPSIS ? ` in the dashboard over ${SYNOPSIS}` : ''}`);
      broken = true;
      continue;
    }
    const started = Date.now();
    let line;
    try {
      line = await run(name);
    } catch (e) {
      line = `FAIL ${name}: error ${oneLine(e && e.stack || e)}`;
      broken = true;
    }
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
  dashboard,
  reload,
  single,
  grouped,
  sortedBy,
  main,
  near,
  groupsNear,
  sameRows,
  num,
  Implausible,
  Mismatch,
};
