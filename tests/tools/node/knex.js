// Knex (query builder, `pg` client) against pgdp: each check builds one ordinary query with
// Knex's API (.count, .countDistinct, .sum, .avg, .min/.max, .groupBy, .orderBy, .limit, .offset,
// .first, .where with a Date, knex.raw with a binding), runs it against the upstream PostgreSQL and then against pgdp, and
// compares the field type OIDs and JS types (common.js). Run by tests/integration/tools_node.rs;
// `node knex.js [check ...]` by hand (the environment of common.js says where to connect).
// With PGDP_SYNOPSIS=people_cube it runs instead a dashboard of Knex counts over the synopsis
// people_cube (.count, .whereIn, .whereNot, .groupBy, .orderBy, the count of a column; common.js
// says when each is ok).
'use strict';

const knexLib = require('knex');
const {
  REFERENCE, config, check, dashboard, reload, single, grouped, sortedBy, main, near, groupsNear,
  sameRows, num, Implausible,
} = require('./common');

const knexes = {};

/** Knex's own warnings and errors go to standard error (by default some go to standard output). */
const toStderr = (what) => (message) => process.stderr.write(`knex ${what}: ${message && message.stack || message}\n`);
const log = { warn: toStderr('warn'), error: toStderr('error'), deprecate: toStderr('deprecate'), debug: toStderr('debug') };

/** One Knex instance per server, created on first use, with Knex's defaults. */
function knex(target) {
  if (!knexes[target]) {
    knexes[target] = knexLib({ client: 'pg', connection: config(target), pool: { min: 0, max: 2 }, log });
  }
  return knexes[target];
}

const JAN_2024 = new Date(Date.UTC(2024, 0, 1));

const checks = {
  // Knex's connection set-up (`select version();` on the first connection).
  connect: check(async (t) => {
    const connection = await knex(t).client.acquireConnection();
    await knex(t).client.releaseConnection(connection);
    return 'connected';
  }),
  count: check(
    (t) => knex(t)('demo.people').count('* as n'),
    (dp, truth) => near('n', dp[0].n, truth[0].n),
  ),
  count_where: check(
    (t) => knex(t)('demo.people').where('age', '>=', 18).count('* as n'),
    (dp, truth) => near('n', dp[0].n, truth[0].n),
  ),
  count_distinct: check(
    (t) => knex(t)('demo.visits').countDistinct('person_id as n'),
    (dp, truth) => near('n', dp[0].n, truth[0].n),
  ),
  sum: check(
    (t) => knex(t)('demo.people').sum('income as total'),
    (dp, truth, ref) => near('total', dp[0].total, ref[0].total),
    REFERENCE.income,
  ),
  avg: check(
    (t) => knex(t)('demo.people').avg('age as mean_age'),
    (dp, truth) => near('mean_age', dp[0].mean_age, truth[0].mean_age),
  ),
  min_max: check(
    (t) => knex(t)('demo.people').min('age as min').max('age as max'),
    (dp, truth, ref) => `${near('min', dp[0].min, ref[0].min, 0, 5)} ${near('max', dp[0].max, ref[0].max, 0, 5)}`,
    REFERENCE.ageRange,
  ),
  group_by: check(
    (t) => knex(t)('demo.people').select('region').count('* as n').avg('income as mean_income')
      .groupBy('region').orderBy('region'),
    (dp, truth, ref) => groupsNear(dp, ref, 'region', ['n', 'mean_income'], 0.05),
    REFERENCE.incomeByRegion,
  ),
  group_by_sum: check(
    (t) => knex(t)('demo.people').select('sex').sum('income as total').groupBy('sex').orderBy('sex'),
    (dp, truth, ref) => groupsNear(dp, ref, 'sex', ['total'], 0.02),
    REFERENCE.incomeBySex,
  ),
  limit: check(
    (t) => knex(t)('demo.people').select('region').count('* as n').groupBy('region')
      .orderBy('region').limit(3),
    (dp, truth) => groupsNear(dp, truth, 'region', ['n'], 0.05),
  ),
  offset: check(
    (t) => knex(t)('demo.people').select('region').count('* as n').groupBy('region')
      .orderBy('region').limit(3).offset(2),
    (dp, truth) => groupsNear(dp, truth, 'region', ['n'], 0.05),
  ),
  // A JS Date compared with a date column (node-postgres sends it as a timestamp string).
  where_date: check(
    (t) => knex(t)('demo.visits').where('visit_date', '>=', JAN_2024).count('* as n'),
    (dp, truth, ref) => near('n', dp[0].n, ref[0].n),
    REFERENCE.visitsFrom2024,
  ),
  where_date_string: check(
    (t) => knex(t)('demo.visits').where('visit_date', '>=', '2024-01-01').count('* as n'),
    (dp, truth, ref) => near('n', dp[0].n, ref[0].n),
    REFERENCE.visitsFrom2024,
  ),
  // knex.raw, the raw-query API, with a `?` binding (sent as $1); it returns node-postgres's result.
  raw: check(
    async (t) => (await knex(t).raw('SELECT region, COUNT(*) AS n FROM demo.people WHERE age >= ? GROUP BY region', [18])).rows,
    (dp, truth, ref) => groupsNear(dp, ref, 'region', ['n'], 0.05),
    REFERENCE.incomeByRegionAdults,
  ),
  // The public table alone: its rows as they are.
  public_select: check(
    (t) => knex(t)('demo.regions').select('region', 'name', 'population').orderBy('region'),
    sameRows,
  ),
  public_limit_offset: check(
    (t) => knex(t)('demo.regions').select('region', 'name').orderBy('region').limit(3).offset(2),
    sameRows,
  ),
  public_first: check(
    (t) => knex(t)('demo.regions').where({ region: 'NO' }).first('name', 'population'),
    sameRows,
  ),
  // Raw rows of a private table: pgdp must refuse.
  private_rows: check(
    (t) => knex(t)('demo.people').select('*').limit(5),
    (dp) => {
      throw new Implausible(`pgdp answered ${dp.length} raw rows of a private table`);
    },
  ),
};

// The dashboard over the synopsis people_cube (demo.people's region, sex and education), run
// with PGDP_SYNOPSIS=people_cube (common.js says when a check of it is ok).
const people = (t) => knex(t)('demo.people');
const byRegion = (t) => people(t).select('region').count('* as n').groupBy('region').orderBy('region');
const countFilter = (t) => people(t).where('region', 'CE').count('* as n');
const n = (rows) => single(rows[0].n);
const peopleCube = {
  // SHOW pgdp.budget through knex.raw.
  budget: async () => num((await knex('pgdp').raw('SHOW pgdp.budget')).rows[0].epsilon_spent),
  checks: {
    total: dashboard((t) => people(t).count('* as n'), n),
    count_filter: dashboard(countFilter, n),
    count_in: dashboard((t) => people(t).whereIn('region', ['CE', 'EA']).count('* as n'), n),
    by_region: dashboard(byRegion, grouped(['region'], (r) => r.n), sortedBy((r) => r.region)),
    by_region_sex: dashboard(
      (t) => people(t).select('region', 'sex').count('* as n').groupBy('region', 'sex'),
      grouped(['region', 'sex'], (r) => r.n),
    ),
    by_sex_filtered: dashboard(
      (t) => people(t).whereIn('education', ['bachelor', 'master']).select('sex').count('* as n')
        .groupBy('sex').orderBy('n', 'desc'),
      grouped(['sex'], (r) => r.n),
      sortedBy((r) => num(r.n), true),
    ),
    // The count of a column: the primary key, and a column of the synopsis.
    count_pk: dashboard((t) => people(t).count('person_id as n'), n),
    count_column: dashboard(
      (t) => people(t).select('education').count('sex as n').groupBy('education'),
      grouped(['education'], (r) => r.n),
    ),
    exclude: dashboard(
      (t) => people(t).whereNot('region', 'CE').select('sex').count('* as n').groupBy('sex'),
      grouped(['sex'], (r) => r.n),
    ),
    reload: reload('by_region', 'count_filter'),
  },
};

main(checks, () => Promise.all(Object.values(knexes).map((k) => k.destroy())), { people_cube: peopleCube });
