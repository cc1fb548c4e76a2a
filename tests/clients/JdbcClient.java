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

    public static void main(String[] args) throws Exception {
        Map<String, Callable<String>> checks = new LinkedHashMap<>();
        checks.put("connect", JdbcClient::connectCheck);
        checks.put("metadata", JdbcClient::metadata);
        checks.put("prepared_twice", JdbcClient::preparedTwice);
        checks.put("fetch_size_autocommit_off", JdbcClient::fetchSize);
        checks.put("refusal", JdbcClient::refusal);
        checks.put("result_types", JdbcClient::resultTypes);
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
