// pgjdbc (Debian's libpostgresql-jdbc-java) against pgdp: connect, DatabaseMetaData getTables and
// getColumns (answered from the shadow catalog), a PreparedStatement with parameters executed
// twice (the second time as a named server-side statement), and a fetch size with autocommit off
// (the driver then reads the result in chunks from a suspended portal), and result column types
// as PostgreSQL gives them (ResultSetMetaData, getBigDecimal, getInt, getDate).
//
// Compiled by tests/integration/clients.rs with javac against /usr/share/java/postgresql.jar. Prints
// `ok <check> <detail>` or `FAIL <check>: <error>` per check (see tests/clients/matrix.py).

import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.math.BigDecimal;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.Types;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.Callable;

public final class JdbcClient {
    private static final List<String> REGIONS =
            Arrays.asList("CE", "EA", "IS", "NE", "NO", "NW", "SE", "SO", "SW", "WE");

    private static String env(String name, String fallback) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? fallback : v;
    }

    private static Connection connect(Properties extra) throws SQLException {
        String url = "jdbc:postgresql://" + env("PGDP_HOST", "127.0.0.1") + ":"
                + env("PGDP_PORT", "6432") + "/" + env("PGDP_DATABASE", "pgdp_demo");
        Properties props = new Properties();
        props.setProperty("user", env("PGDP_USER", "analyst"));
        props.setProperty("password", env("PGDP_PASSWORD", "analyst"));
        props.setProperty("sslmode", "disable");
        props.setProperty("connectTimeout", "10");
        props.setProperty("socketTimeout", "60");
        props.putAll(extra);
        return DriverManager.getConnection(url, props);
    }

    private static void check(boolean condition, String message) {
        if (!condition) {
            throw new AssertionError(message);
        }
    }

    private static String connectCheck() throws Exception {
        try (Connection c = connect(new Properties()); Statement s = c.createStatement();
                ResultSet rs = s.executeQuery("SELECT current_user")) {
            check(rs.next(), "no row");
            check(rs.getString(1).equals(env("PGDP_USER", "analyst")), rs.getString(1));
            return "product=" + c.getMetaData().getDatabaseProductVersion().replace(' ', '_');
        }
    }

    private static String metadata() throws Exception {
        try (Connection c = connect(new Properties())) {
            DatabaseMetaData md = c.getMetaData();
            List<String> tables = new ArrayList<>();
            try (ResultSet rs = md.getTables(null, "demo", "%", new String[] {"TABLE"})) {
                while (rs.next()) {
                    tables.add(rs.getString("TABLE_NAME"));
                }
            }
            check(tables.equals(Arrays.asList("people", "prescriptions", "regions", "visits")), tables.toString());
            Map<String, String> columns = new LinkedHashMap<>();
            try (ResultSet rs = md.getColumns(null, "demo", "people", "%")) {
                while (rs.next()) {
                    columns.put(rs.getString("COLUMN_NAME"), rs.getString("TYPE_NAME"));
                }
            }
            check(new TreeSet<>(columns.keySet()).equals(new TreeSet<>(Arrays.asList(
                    "person_id", "age", "sex", "region", "education", "income"))), columns.toString());
            check("int4".equals(columns.get("age")), columns.toString());
            List<String> schemas = new ArrayList<>();
            try (ResultSet rs = md.getSchemas()) {
                while (rs.next()) {
                    schemas.add(rs.getString("TABLE_SCHEM"));
                }
            }
            check(schemas.contains("demo"), schemas.toString());
            return "tables=" + String.join(",", tables) + " columns=" + columns.size();
        }
    }

    private static String preparedTwice() throws Exception {
        Properties props = new Properties();
        // The second execution then uses a named server-side statement.
        props.setProperty("prepareThreshold", "1");
        try (Connection c = connect(props);
                PreparedStatement ps = c.prepareStatement(
                        "SELECT COUNT(*) FROM demo.people WHERE age >= ? AND region = ?")) {
            long[] counts = new long[2];
            for (int i = 0; i < 2; i++) {
                ps.setInt(1, 18);
                ps.setString(2, "NO");
                try (ResultSet rs = ps.executeQuery()) {
                    check(rs.next(), "no row");
                    counts[i] = rs.getLong(1);
                    check(!rs.next(), "more than one row");
                }
            }
            check(counts[0] > 1000 && counts[0] < 101000, "count " + counts[0]);
            check(counts[0] == counts[1], "identical query answered " + counts[0] + " then " + counts[1]);
            ps.setInt(1, 0);
            ps.setString(2, "SO");
            try (ResultSet rs = ps.executeQuery()) {
                check(rs.next(), "no row");
                check(rs.getLong(1) > 1000, "count " + rs.getLong(1));
            }
            return "count=" + counts[0];
        }
    }

    private static String resultTypes() throws Exception {
        // The types PostgreSQL gives this SQL: bigint, numeric (AVG and SUM of numeric and AVG
        // of an integer), integer (MIN of an integer column), date (a date key).
        String sql = "SELECT visit_date, COUNT(*), AVG(cost), SUM(cost) FROM demo.visits "
                + "WHERE visit_date >= DATE '2024-06-01' GROUP BY visit_date";
        try (Connection c = connect(new Properties());
                PreparedStatement ps = c.prepareStatement(sql)) {
            ResultSetMetaData md = ps.getMetaData();
            int[] expected = {Types.DATE, Types.BIGINT, Types.NUMERIC, Types.NUMERIC};
            for (int i = 0; i < expected.length; i++) {
                check(md.getColumnType(i + 1) == expected[i],
                        "column " + (i + 1) + " is " + md.getColumnTypeName(i + 1));
            }
            int rows = 0;
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    rows++;
                    check(rs.getDate(1).toString().compareTo("2024-06-01") >= 0, rs.getString(1));
                    check(rs.getLong(2) >= 0, "count " + rs.getLong(2));
                    BigDecimal avg = rs.getBigDecimal(3);
                    check(avg.compareTo(BigDecimal.ZERO) >= 0 && avg.compareTo(new BigDecimal(2000)) <= 0,
                            "avg " + avg);
                    check(rs.getBigDecimal(4) != null, "sum");
                }
            }
            try (Statement s = c.createStatement();
                    ResultSet rs = s.executeQuery("SELECT MIN(age), MAX(age) FROM demo.people")) {
                check(rs.getMetaData().getColumnType(1) == Types.INTEGER, rs.getMetaData().getColumnTypeName(1));
                check(rs.next(), "no row");
                int min = rs.getInt(1);
                check(min >= 0 && min <= 100 && rs.getInt(2) >= min, "min " + min + " max " + rs.getInt(2));
            }
            return "date_groups=" + rows;
        }
    }

    private static String fetchSize() throws Exception {
        try (Connection c = connect(new Properties())) {
            c.setAutoCommit(false);
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT region, COUNT(*) FROM demo.people GROUP BY region")) {
                ps.setFetchSize(3);
                List<String> regions = new ArrayList<>();
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) {
                        regions.add(rs.getString(1));
                    }
                }
                regions.sort(null);
                check(regions.equals(REGIONS), regions.toString());
            }
            c.commit();
            return "rows=10 fetch_size=3";
        }
    }

    private static String refusal() throws Exception {
        try (Connection c = connect(new Properties()); Statement s = c.createStatement()) {
            try {
                s.executeQuery("SELECT * FROM demo.people");
            } catch (SQLException e) {
                check("42501".equals(e.getSQLState()), "SQLSTATE " + e.getSQLState());
                try (ResultSet rs = s.executeQuery("SELECT 1")) {
                    check(rs.next() && rs.getInt(1) == 1, "connection unusable");
                }
                return "42501";
            }
            throw new AssertionError("no refusal");
        }
    }

    // ---------------------------------------------------------------------------------------
    // A Metabase-like session. The SQL is what Metabase's PostgreSQL driver generates
    // (metabase/metabase, src/metabase/driver/postgres.clj: db-default-timezone's `show
    // timezone;`, get-tables-sql, describe-fields-sql, and the honeysql forms of MBQL questions:
    // date-trunc of a date column cast back to date, extract-integer buckets, implicit LEFT JOINs
    // of lookup tables, the default row limit 1048575 and the `-- Metabase::` remark), sent the
    // way Metabase sends it: pgjdbc prepared statements with `?` parameters.

    private static final String METABASE_REMARK =
            "-- Metabase:: userID: 1 queryType: MBQL queryHash: 4c0e7e2e9f6d\n";

    private static String metabaseSync() throws Exception {
        try (Connection c = connect(new Properties())) {
            try (PreparedStatement ps = c.prepareStatement("show timezone;");
                    ResultSet rs = ps.executeQuery()) {
                check(rs.next() && rs.getString(1) != null, "no timezone");
            }
            List<String> tables = new ArrayList<>();
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT \"n\".\"nspname\" AS \"schema\", \"c\".\"relname\" AS \"name\", CASE \"c\".\"relkind\" WHEN 'r' THEN 'TABLE' WHEN 'p' THEN 'PARTITIONED TABLE' WHEN 'v' THEN 'VIEW' WHEN 'f' THEN 'FOREIGN TABLE' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE NULL END AS \"type\", \"d\".\"description\" AS \"description\", \"stat\".\"n_live_tup\" AS \"estimated_row_count\" FROM \"pg_catalog\".\"pg_class\" AS \"c\" INNER JOIN \"pg_catalog\".\"pg_namespace\" AS \"n\" ON \"c\".\"relnamespace\" = \"n\".\"oid\" LEFT JOIN \"pg_catalog\".\"pg_description\" AS \"d\" ON (\"c\".\"oid\" = \"d\".\"objoid\") AND (\"d\".\"objsubid\" = 0) AND (\"d\".\"classoid\" = 'pg_class'::regclass) LEFT JOIN \"pg_stat_user_tables\" AS \"stat\" ON (\"n\".\"nspname\" = \"stat\".\"schemaname\") AND (\"c\".\"relname\" = \"stat\".\"relname\") WHERE (\"c\".\"relnamespace\" = \"n\".\"oid\") AND (\"n\".\"nspname\" !~ '^pg_') AND (\"n\".\"nspname\" <> 'information_schema') AND c.relkind in ('r', 'p', 'v', 'f', 'm') AND (\"n\".\"nspname\" IN (?)) ORDER BY \"type\" ASC, \"schema\" ASC, \"name\" ASC")) {
                ps.setString(1, "demo");
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) {
                        tables.add(rs.getString("name"));
                        // The shadow catalog holds no rows: no estimate reveals a table's size.
                        check(rs.getLong("estimated_row_count") == 0, "estimate " + rs.getLong("estimated_row_count"));
                    }
                }
            }
            check(tables.equals(Arrays.asList("people", "prescriptions", "regions", "visits")), tables.toString());
            Map<String, String> types = new LinkedHashMap<>();
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT \"c\".\"column_name\" AS \"name\", CASE WHEN \"c\".\"udt_schema\" IN ('public', 'pg_catalog') THEN FORMAT('%s', \"c\".\"udt_name\") ELSE FORMAT('\"%s\".\"%s\"', \"c\".\"udt_schema\", \"c\".\"udt_name\") END AS \"database-type\", \"c\".\"ordinal_position\" - 1 AS \"database-position\", \"c\".\"table_schema\" AS \"table-schema\", \"c\".\"table_name\" AS \"table-name\", \"pk\".\"column_name\" IS NOT NULL AS \"pk?\", COL_DESCRIPTION(CAST(CAST(FORMAT('%I.%I', CAST(\"c\".\"table_schema\" AS TEXT), CAST(\"c\".\"table_name\" AS TEXT)) AS REGCLASS) AS OID), \"c\".\"ordinal_position\") AS \"field-comment\" FROM \"information_schema\".\"columns\" AS \"c\" LEFT JOIN (SELECT \"tc\".\"table_schema\", \"tc\".\"table_name\", \"kc\".\"column_name\" FROM \"information_schema\".\"table_constraints\" AS \"tc\" INNER JOIN \"information_schema\".\"key_column_usage\" AS \"kc\" ON (\"tc\".\"constraint_name\" = \"kc\".\"constraint_name\") AND (\"tc\".\"table_schema\" = \"kc\".\"table_schema\") AND (\"tc\".\"table_name\" = \"kc\".\"table_name\") WHERE \"tc\".\"constraint_type\" = 'PRIMARY KEY') AS \"pk\" ON (\"c\".\"table_schema\" = \"pk\".\"table_schema\") AND (\"c\".\"table_name\" = \"pk\".\"table_name\") AND (\"c\".\"column_name\" = \"pk\".\"column_name\") WHERE c.table_schema !~ '^information_schema|catalog_history|pg_' AND (\"c\".\"table_schema\" IN (?)) ORDER BY \"table-schema\" ASC, \"table-name\" ASC, \"database-position\" ASC")) {
                ps.setString(1, "demo");
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) {
                        types.put(rs.getString("table-name") + "." + rs.getString("name"), rs.getString("database-type"));
                    }
                }
            }
            check("date".equals(types.get("visits.visit_date")), types.toString());
            check("numeric".equals(types.get("people.income")), types.toString());
            check("int4".equals(types.get("people.age")), types.toString());
            return "tables=" + tables.size() + " fields=" + types.size();
        }
    }

    private static String metabaseQuestions() throws Exception {
        try (Connection c = connect(new Properties())) {
            StringBuilder detail = new StringBuilder();
            // Count by a category, with Metabase's row limit.
            try (PreparedStatement ps = c.prepareStatement(METABASE_REMARK
                    + "SELECT \"demo\".\"people\".\"region\" AS \"region\", COUNT(*) AS \"count\" FROM \"demo\".\"people\" WHERE \"demo\".\"people\".\"age\" >= ? GROUP BY \"demo\".\"people\".\"region\" ORDER BY \"demo\".\"people\".\"region\" ASC LIMIT 1048575")) {
                ps.setInt(1, 18);
                try (ResultSet rs = ps.executeQuery()) {
                    check(rs.getMetaData().getColumnType(2) == Types.BIGINT, rs.getMetaData().getColumnTypeName(2));
                    List<String> regions = new ArrayList<>();
                    while (rs.next()) {
                        regions.add(rs.getString(1));
                        check(rs.getLong(2) >= 0, "count " + rs.getLong(2));
                    }
                    check(regions.equals(REGIONS), regions.toString());
                }
            }
            // Visits by month: date_trunc of a date column, cast back to date.
            try (PreparedStatement ps = c.prepareStatement(METABASE_REMARK
                    + "SELECT CAST(DATE_TRUNC('month', \"demo\".\"visits\".\"visit_date\") AS date) AS \"visit_date\", COUNT(*) AS \"count\" FROM \"demo\".\"visits\" GROUP BY CAST(DATE_TRUNC('month', \"demo\".\"visits\".\"visit_date\") AS date) ORDER BY CAST(DATE_TRUNC('month', \"demo\".\"visits\".\"visit_date\") AS date) ASC LIMIT 1048575");
                    ResultSet rs = ps.executeQuery()) {
                check(rs.getMetaData().getColumnType(1) == Types.DATE, rs.getMetaData().getColumnTypeName(1));
                int months = 0;
                String previous = "";
                while (rs.next()) {
                    String month = rs.getDate(1).toString();
                    check(month.endsWith("-01") && month.compareTo(previous) > 0, month + " after " + previous);
                    previous = month;
                    months++;
                }
                check(months >= 20 && months <= 24, "months " + months);
                detail.append("months=").append(months);
            }
            // Month of year: extract-integer, an int4 column.
            try (PreparedStatement ps = c.prepareStatement(METABASE_REMARK
                    + "SELECT CAST(extract(month from \"demo\".\"visits\".\"visit_date\") AS integer) AS \"visit_date\", AVG(\"demo\".\"visits\".\"cost\") AS \"avg\" FROM \"demo\".\"visits\" GROUP BY CAST(extract(month from \"demo\".\"visits\".\"visit_date\") AS integer) ORDER BY CAST(extract(month from \"demo\".\"visits\".\"visit_date\") AS integer) ASC LIMIT 1048575");
                    ResultSet rs = ps.executeQuery()) {
                check(rs.getMetaData().getColumnType(1) == Types.INTEGER, rs.getMetaData().getColumnTypeName(1));
                check(rs.getMetaData().getColumnType(2) == Types.NUMERIC, rs.getMetaData().getColumnTypeName(2));
                List<Integer> months = new ArrayList<>();
                while (rs.next()) {
                    months.add(rs.getInt(1));
                    BigDecimal avg = rs.getBigDecimal(2);
                    check(avg.compareTo(BigDecimal.ZERO) >= 0 && avg.compareTo(new BigDecimal(2000)) <= 0, "avg " + avg);
                }
                List<Integer> all = new ArrayList<>();
                for (int m = 1; m <= 12; m++) {
                    all.add(m);
                }
                check(months.equals(all), months.toString());
            }
            // An implicit join of a lookup table: Metabase writes LEFT JOIN.
            try (PreparedStatement ps = c.prepareStatement(METABASE_REMARK
                    + "SELECT \"Regions\".\"name\" AS \"Regions__name\", AVG(\"demo\".\"people\".\"income\") AS \"avg\" FROM \"demo\".\"people\" LEFT JOIN \"demo\".\"regions\" AS \"Regions\" ON \"demo\".\"people\".\"region\" = \"Regions\".\"region\" GROUP BY \"Regions\".\"name\" ORDER BY \"Regions\".\"name\" ASC LIMIT 1048575");
                    ResultSet rs = ps.executeQuery()) {
                check("Regions__name".equals(rs.getMetaData().getColumnLabel(1)), rs.getMetaData().getColumnLabel(1));
                int names = 0;
                while (rs.next()) {
                    check(rs.getString(1) != null, "a NULL region name");
                    names++;
                }
                check(names == 10, "names " + names);
                detail.append(" names=").append(names);
            }
            // A native question, wrapped as Metabase wraps it.
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT \"source\".* FROM (SELECT sex, COUNT(*) AS n FROM demo.people GROUP BY sex) AS \"source\" LIMIT 2000");
                    ResultSet rs = ps.executeQuery()) {
                int rows = 0;
                while (rs.next()) {
                    rows++;
                }
                check(rows == 3, "rows " + rows);
            }
            return detail.toString();
        }
    }

    public static void main(String[] args) throws Exception {
        Map<String, Callable<String>> checks = new LinkedHashMap<>();
        checks.put("connect", JdbcClient::connectCheck);
        checks.put("metadata", JdbcClient::metadata);
        checks.put("prepared_twice", JdbcClient::preparedTwice);
        checks.put("fetch_size_autocommit_off", JdbcClient::fetchSize);
        checks.put("refusal", JdbcClient::refusal);
        checks.put("result_types", JdbcClient::resultTypes);
        checks.put("metabase_sync", JdbcClient::metabaseSync);
        checks.put("metabase_questions", JdbcClient::metabaseQuestions);
        List<String> wanted = args.length > 0 ? Arrays.asList(args) : new ArrayList<>(checks.keySet());
        boolean failed = false;
        for (String name : wanted) {
            try {
                Callable<String> check = checks.get(name);
                if (check == null) {
                    throw new IllegalArgumentException("no such check");
                }
                System.out.println("ok " + name + " " + check.call());
            } catch (Throwable e) {
                failed = true;
                System.out.println("FAIL " + name + ": " + String.valueOf(e).replace('\n', ' '));
                e.printStackTrace();
            }
        }
        System.exit(failed ? 1 : 0);
    }
}
