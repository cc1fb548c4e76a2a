// Prisma Client 7 (prisma-client-js, the `@prisma/adapter-pg` driver adapter: no Rust query
// engine) against pgdp: each check calls one ordinary Prisma Client API (count, aggregate,
// groupBy, findMany/findUnique on the public table, findMany on a private table, $queryRaw),
// runs it against the upstream PostgreSQL and then against pgdp, and compares the field type
// OIDs and JS types (number, BigInt, Decimal, Date) with common.js. The client is generated from
// prisma/schema.prisma by .ci/setup-node-tools. Run by tests/integration/tools_node.rs;
// `node prisma.js [check ...]` by hand (the environment of common.js says where to connect).
// With PGDP_SYNOPSIS=people_cube it runs instead a dashboard of Prisma Client counts over the
// synopsis people_cube (count with where, `in`, NOT and select; groupBy with _count and orderBy;
// common.js says when each is ok).
'use strict';

const { PrismaClient } = require('@prisma/client');
const { PrismaPg } = require('@prisma/adapter-pg');
const {
  REFERENCE, config, check, dashboard, reload, single, grouped, sortedBy, main, near, groupsNear,
  sameRows, num, Implausible,
} = require('./common');

const clients = {};

/** One PrismaClient per server; the SQL of its query log goes to standard error. */
function prisma(target) {
  if (!clients[target]) {
    const client = new PrismaClient({
      adapter: new PrismaPg({ ...config(target), max: 2 }),
      log: [{ emit: 'event', level: 'query' }],
    });
    client.$on('query', (e) => process.stderr.write(`prisma[${target}]: ${e.query} ${e.params}\n`));
    clients[target] = client;
  }
  return clients[target];
}

/** Rows of groupBy with their `_count._all` and `_avg.income` flattened for groupsNear. */
function flat(rows) {
  return rows.map((r) => ({
    region: r.region,
    n: r._count && r._count._all,
    mean_income: r._avg && r._avg.income,
  }));
}

const checks = {
  connect: check(async (t) => {
    await prisma(t).$connect();
    return 'connected';
  }),
  count: check(
    (t) => prisma(t).people.count(),
    (dp, truth) => near('count', dp, truth),
  ),
  count_where: check(
    (t) => prisma(t).people.count({ where: { age: { gte: 18 } } }),
    (dp, truth) => near('count', dp, truth),
  ),
  // A Date against a `DateTime @db.Date` field (the adapter binds it as 'YYYY-MM-DD').
  count_date: check(
    (t) => prisma(t).visits.count({ where: { visit_date: { gte: new Date('2024-01-01') } } }),
    (dp, truth, ref) => near('count', dp, ref[0].n),
    REFERENCE.visitsFrom2024,
  ),
  // contains: `"diagnosis"::text LIKE ('%' || $1 || '%')`.
  count_contains: check(
    (t) => prisma(t).visits.count({ where: { diagnosis: { contains: 'J0' } } }),
    (dp, truth) => near('count', dp, truth),
  ),
  // A relation filter: `LEFT JOIN "demo"."people" AS "j0" ON ("j0"."person_id") = (…)`.
  count_relation_filter: check(
    (t) => prisma(t).visits.count({ where: { people: { region: 'NO' } } }),
    (dp, truth) => near('count', dp, truth),
  ),
  aggregate: check(
    (t) => prisma(t).people.aggregate({
      _count: { _all: true },
      _sum: { income: true },
      _avg: { income: true, age: true },
    }),
    (dp, truth, ref) => [
      near('count', dp._count._all, truth._count._all),
      near('sum_income', dp._sum.income, ref[0].total),
      near('avg_income', dp._avg.income, ref[0].mean_income),
      near('avg_age', dp._avg.age, truth._avg.age),
    ].join(' '),
    REFERENCE.income,
  ),
  aggregate_min_max: check(
    (t) => prisma(t).people.aggregate({ _min: { age: true }, _max: { age: true } }),
    (dp, truth, ref) => `${near('min', dp._min.age, ref[0].min, 0, 5)} ${near('max', dp._max.age, ref[0].max, 0, 5)}`,
    REFERENCE.ageRange,
  ),
  group_by: check(
    (t) => prisma(t).people.groupBy({
      by: ['region'],
      _count: { _all: true },
      _avg: { income: true },
      orderBy: { region: 'asc' },
    }),
    (dp, truth, ref) => groupsNear(flat(dp), ref, 'region', ['n', 'mean_income'], 0.05),
    REFERENCE.incomeByRegion,
  ),
  group_by_take_skip: check(
    (t) => prisma(t).people.groupBy({
      by: ['region'],
      _count: { _all: true },
      orderBy: { region: 'asc' },
      take: 3,
      skip: 2,
    }),
    (dp, truth) => groupsNear(flat(dp), flat(truth), 'region', ['n'], 0.05),
  ),
  // The public table alone: its rows as they are.
  public_findmany: check(
    (t) => prisma(t).regions.findMany({ orderBy: { region: 'asc' } }),
    sameRows,
  ),
  public_findmany_take_skip: check(
    (t) => prisma(t).regions.findMany({ orderBy: { region: 'asc' }, take: 3, skip: 2 }),
    sameRows,
  ),
  public_findunique: check(
    (t) => prisma(t).regions.findUnique({ where: { region: 'NO' } }),
    sameRows,
  ),
  // Raw rows of a private table: pgdp must refuse.
  private_findmany: check(
    (t) => prisma(t).people.findMany({ take: 5 }),
    (dp) => {
      throw new Implausible(`pgdp answered ${dp.length} raw rows of a private table`);
    },
  ),
  // $queryRaw, the raw-query API: COUNT(*) arrives as BigInt, AVG of numeric as Decimal.
  query_raw: check(
    (t) => prisma(t).$queryRaw`SELECT region, COUNT(*) AS n, AVG(income) AS mean_income
      FROM demo.people WHERE age >= ${18} GROUP BY region ORDER BY region`,
    (dp, truth, ref) => groupsNear(dp, ref, 'region', ['n', 'mean_income'], 0.05),
    REFERENCE.incomeByRegionAdults,
  ),
  // A Date bound by $queryRaw (the adapter sends 'YYYY-MM-DD HH:MM:SS') against a date column.
  query_raw_date: check(
    (t) => prisma(t).$queryRaw`SELECT COUNT(*) AS n FROM demo.visits WHERE visit_date >= ${new Date('2024-01-01')}`,
    (dp, truth, ref) => near('n', dp[0].n, ref[0].n),
    REFERENCE.visitsFrom2024,
  ),
};

// The dashboard over the synopsis people_cube (demo.people's region, sex and education), run
// with PGDP_SYNOPSIS=people_cube (common.js says when a check of it is ok). Prisma Client's API
// has no NOTICEs: they come from the tap on node-postgres, which @prisma/adapter-pg uses.
const people = (t) => prisma(t).people;
const byRegion = (t) => people(t).groupBy({ by: ['region'], _count: { _all: true }, orderBy: { region: 'asc' } });
const countFilter = (t) => people(t).count({ where: { region: 'CE' } });
const countAll = (r) => r._count._all;
const peopleCube = {
  // SHOW pgdp.budget through $queryRaw.
  budget: async () => num((await prisma('pgdp').$queryRaw`SHOW pgdp.budget`)[0].epsilon_spent),
  checks: {
    total: dashboard((t) => people(t).count(), single),
    count_filter: dashboard(countFilter, single),
    count_in: dashboard((t) => people(t).count({ where: { region: { in: ['CE', 'EA'] } } }), single),
    by_region: dashboard(byRegion, grouped(['region'], countAll), sortedBy((r) => r.region)),
    by_region_sex: dashboard(
      (t) => people(t).groupBy({ by: ['region', 'sex'], _count: { _all: true } }),
      grouped(['region', 'sex'], countAll),
    ),
    by_sex_filtered: dashboard(
      (t) => people(t).groupBy({
        by: ['sex'],
        where: { education: { in: ['bachelor', 'master'] } },
        _count: { _all: true },
        orderBy: { _count: { sex: 'desc' } },
      }),
      grouped(['sex'], countAll),
      sortedBy(countAll, true),
    ),
    // count with a select: the rows, and the rows whose region is not NULL, one statement.
    count_select: dashboard(
      (t) => people(t).count({ select: { _all: true, region: true } }),
      (r) => [['_all', r._all], ['region', r.region]],
    ),
    // The count of the primary key per group.
    count_pk: dashboard(
      (t) => people(t).groupBy({ by: ['education'], _count: { person_id: true } }),
      grouped(['education'], (r) => r._count.person_id),
    ),
    exclude: dashboard(
      (t) => people(t).groupBy({ by: ['sex'], where: { NOT: { region: 'CE' } }, _count: { _all: true } }),
      grouped(['sex'], countAll),
    ),
    reload: reload('by_region', 'count_filter'),
  },
};

main(checks, () => Promise.all(Object.values(clients).map((c) => c.$disconnect())), { people_cube: peopleCube });
