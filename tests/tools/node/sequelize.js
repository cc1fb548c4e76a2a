// Sequelize 6 (postgres dialect, its default options) against pgdp: each check calls one ordinary
// Sequelize API (authenticate, Model.count/sum/min/max/aggregate, findAll with grouped
// attributes, raw queries with bind parameters, queryInterface.describeTable, findAll on the
// public and a private table), runs it against the upstream PostgreSQL and then against pgdp, and
// compares the field type OIDs and JS types (common.js). Run by tests/integration/tools_node.rs;
// `node sequelize.js [check ...]` by hand (the environment of common.js says where to connect).
// With PGDP_SYNOPSIS=people_cube it runs instead a dashboard of Sequelize counts over the
// synopsis people_cube (Model.count with where, an array value, Op.not, group and col; findAll
// with grouped COUNT attributes and an order; common.js says when each is ok).
'use strict';

const { Sequelize, DataTypes, Op, QueryTypes } = require('sequelize');
const {
  REFERENCE, config, check, dashboard, reload, single, grouped, sortedBy, main, near, groupsNear,
  sameRows, num, Implausible, Mismatch,
} = require('./common');

const instances = {};

/**
 * One Sequelize per server with the dialect's defaults (timezone '+00:00', client_min_messages
 * 'warning', a pool of 5), except that the SQL it logs goes to standard error (by default it
 * would go to standard output, which carries the check lines).
 */
function sequelize(target) {
  if (!instances[target]) {
    const c = config(target);
    const s = new Sequelize(c.database, c.user, c.password, {
      host: c.host,
      port: c.port,
      dialect: 'postgres',
      logging: (sql) => process.stderr.write(`sequelize[${target}]: ${sql}\n`),
    });
    const options = { schema: 'demo', timestamps: false, freezeTableName: true };
    s.define('regions', {
      region: { type: DataTypes.TEXT, primaryKey: true },
      name: DataTypes.TEXT,
      population: DataTypes.INTEGER,
    }, options);
    s.define('people', {
      person_id: { type: DataTypes.BIGINT, primaryKey: true },
      age: DataTypes.INTEGER,
      sex: DataTypes.TEXT,
      region: DataTypes.TEXT,
      education: DataTypes.TEXT,
      income: DataTypes.DECIMAL(12, 2),
    }, options);
    s.define('visits', {
      visit_id: { type: DataTypes.BIGINT, primaryKey: true },
      person_id: DataTypes.BIGINT,
      visit_date: DataTypes.DATEONLY,
      clinic: DataTypes.TEXT,
      diagnosis: DataTypes.TEXT,
      cost: DataTypes.DECIMAL(10, 2),
    }, options);
    s.models.visits.belongsTo(s.models.people, { foreignKey: 'person_id', as: 'person' });
    instances[target] = s;
  }
  return instances[target];
}

const model = (t, name) => sequelize(t).model(name);

const checks = {
  // authenticate(): the dialect's connection set-up (SET client_min_messages, SET TIME ZONE,
  // the pg_type lookup of its type parsers), then `SELECT 1+1 AS result`.
  connect: check(async (t) => {
    await sequelize(t).authenticate();
    return 'authenticated';
  }),
  count: check(
    (t) => model(t, 'people').count(),
    (dp, truth) => near('count', dp, truth),
  ),
  count_where: check(
    (t) => model(t, 'people').count({ where: { age: { [Op.gte]: 18 } } }),
    (dp, truth) => near('count', dp, truth),
  ),
  count_distinct: check(
    (t) => model(t, 'visits').count({ distinct: true, col: 'person_id' }),
    (dp, truth) => near('count', dp, truth),
  ),
  count_group: check(
    (t) => model(t, 'people').count({ group: ['region'] }),
    (dp, truth) => groupsNear(dp, truth, 'region', ['count'], 0.05),
  ),
  sum: check(
    (t) => model(t, 'people').sum('income'),
    (dp, truth, ref) => near('sum', dp, ref[0].total),
    REFERENCE.income,
  ),
  avg: check(
    (t) => model(t, 'people').aggregate('age', 'avg'),
    (dp, truth) => near('avg', dp, truth),
  ),
  min_max: check(
    async (t) => [await model(t, 'people').min('age'), await model(t, 'people').max('age')],
    (dp, truth, ref) => `${near('min', dp[0], ref[0].min, 0, 5)} ${near('max', dp[1], ref[0].max, 0, 5)}`,
    REFERENCE.ageRange,
  ),
  // The grouped findAll of a report: COUNT and AVG per region.
  findall_group: check(
    (t) => model(t, 'people').findAll({
      attributes: [
        'region',
        [Sequelize.fn('COUNT', Sequelize.col('person_id')), 'n'],
        [Sequelize.fn('AVG', Sequelize.col('income')), 'mean_income'],
      ],
      group: ['region'],
      order: [['region', 'ASC']],
      raw: true,
    }),
    (dp, truth, ref) => groupsNear(dp, ref, 'region', ['n', 'mean_income'], 0.05),
    REFERENCE.incomeByRegion,
  ),
  findall_group_limit: check(
    (t) => model(t, 'people').findAll({
      attributes: ['region', [Sequelize.fn('COUNT', Sequelize.col('person_id')), 'n']],
      group: ['region'],
      order: [['region', 'ASC']],
      limit: 3,
      offset: 2,
      raw: true,
    }),
    (dp, truth) => groupsNear(dp, truth, 'region', ['n'], 0.05),
  ),
  // An include with a where: Sequelize writes the filter into the INNER JOIN's ON.
  count_include_where: check(
    (t) => model(t, 'visits').count({
      include: [{ model: model(t, 'people'), as: 'person', where: { region: 'NO' } }],
    }),
    (dp, truth) => near('count', dp, truth),
  ),
  // A Date against a DATEONLY attribute (Sequelize writes it as a literal).
  count_date: check(
    (t) => model(t, 'visits').count({ where: { visit_date: { [Op.gte]: new Date(Date.UTC(2024, 0, 1)) } } }),
    (dp, truth, ref) => near('count', dp, ref[0].n),
    REFERENCE.visitsFrom2024,
  ),
  // sequelize.query, the raw-query API: plain SQL, then with bind parameters ($1).
  raw_query: check(
    (t) => sequelize(t).query(
      'SELECT region, COUNT(*) AS n FROM demo.people GROUP BY region ORDER BY region',
      { type: QueryTypes.SELECT },
    ),
    (dp, truth) => groupsNear(dp, truth, 'region', ['n'], 0.05),
  ),
  raw_query_bind: check(
    (t) => sequelize(t).query(
      'SELECT COUNT(*) AS n, AVG(income) AS mean_income FROM demo.people WHERE age >= $1',
      { type: QueryTypes.SELECT, bind: [18] },
    ),
    (dp, truth, ref) => `${near('n', dp[0].n, ref[0].n)} ${near('mean_income', dp[0].mean_income, ref[0].mean_income)}`,
    REFERENCE.incomeAdults,
  ),
  // describeTable, without the columns' comments: pgdp's shadow catalog comments each column
  // with its policy (bounds, groupable, public values), which the upstream's columns lack.
  describe_table: check(
    async (t) => {
      const columns = await sequelize(t).getQueryInterface().describeTable({ tableName: 'people', schema: 'demo' });
      for (const column of Object.values(columns)) delete column.comment;
      return columns;
    },
    (dp, truth) => {
      if (JSON.stringify(dp) !== JSON.stringify(truth)) {
        const differ = [...new Set([...Object.keys(truth), ...Object.keys(dp)])].filter((k) => JSON.stringify(dp[k]) !== JSON.stringify(truth[k]));
        throw new Mismatch(differ.map((k) => `${k}: ${JSON.stringify(dp[k])}, PostgreSQL ${JSON.stringify(truth[k])}`).join('; '));
      }
      const pk = Object.keys(dp).filter((k) => dp[k].primaryKey);
      return `columns=${Object.entries(dp).map(([k, v]) => `${k}:${v.type}${v.allowNull ? '' : ' NOT NULL'}`).join(',')} primary_key=${pk}`;
    },
  ),
  // The public table alone: its rows as they are.
  public_findall: check(
    (t) => model(t, 'regions').findAll({ order: [['region', 'ASC']], raw: true }),
    sameRows,
  ),
  public_findbypk: check(
    (t) => model(t, 'regions').findByPk('NO', { raw: true }),
    sameRows,
  ),
  // Raw rows of a private table: pgdp must refuse.
  private_findall: check(
    (t) => model(t, 'people').findAll({ limit: 5, raw: true }),
    (dp) => {
      throw new Implausible(`pgdp answered ${dp.length} raw rows of a private table`);
    },
  ),
};

// The dashboard over the synopsis people_cube (demo.people's region, sex and education), run
// with PGDP_SYNOPSIS=people_cube (common.js says when a check of it is ok).
const byRegion = (t) => model(t, 'people').findAll({
  attributes: ['region', [Sequelize.fn('COUNT', Sequelize.col('*')), 'n']],
  group: ['region'],
  order: [['region', 'ASC']],
  raw: true,
});
const countFilter = (t) => model(t, 'people').count({ where: { region: 'CE' } });
const peopleCube = {
  // SHOW pgdp.budget through sequelize.query.
  budget: async () => num((await sequelize('pgdp').query('SHOW pgdp.budget', { type: QueryTypes.SELECT }))[0].epsilon_spent),
  checks: {
    total: dashboard((t) => model(t, 'people').count(), single),
    count_filter: dashboard(countFilter, single),
    // An array value: IN ('CE', 'EA').
    count_in: dashboard((t) => model(t, 'people').count({ where: { region: ['CE', 'EA'] } }), single),
    by_region: dashboard(byRegion, grouped(['region'], (r) => r.n), sortedBy((r) => r.region)),
    by_region_sex: dashboard(
      (t) => model(t, 'people').count({ group: ['region', 'sex'] }),
      grouped(['region', 'sex'], (r) => r.count),
    ),
    by_sex_filtered: dashboard(
      (t) => model(t, 'people').findAll({
        attributes: ['sex', [Sequelize.fn('COUNT', Sequelize.col('*')), 'n']],
        where: { education: { [Op.in]: ['bachelor', 'master'] } },
        group: ['sex'],
        order: [[Sequelize.col('n'), 'DESC']],
        raw: true,
      }),
      grouped(['sex'], (r) => r.n),
      sortedBy((r) => num(r.n), true),
    ),
    // count({ col }): the count of a column, the primary key and a column of the synopsis.
    count_pk: dashboard((t) => model(t, 'people').count({ col: 'person_id' }), single),
    count_column: dashboard(
      (t) => model(t, 'people').count({ col: 'sex', group: ['education'] }),
      grouped(['education'], (r) => r.count),
    ),
    exclude: dashboard(
      (t) => model(t, 'people').count({ where: { [Op.not]: { region: 'CE' } }, group: ['sex'] }),
      grouped(['sex'], (r) => r.count),
    ),
    reload: reload('by_region', 'count_filter'),
  },
};

main(checks, () => Promise.all(Object.values(instances).map((s) => s.close())), { people_cube: peopleCube });
