-- psql against pgdp (run by tests/integration/clients.rs with psql -X -f): introspection from the shadow
-- catalog, a DP query, a refused query and EXPLAIN. The test reads the output.
\set VERBOSITY verbose
SET search_path = demo, public;
\d
\echo -- dt
\dt demo.*
\d demo.people
SELECT COUNT(*) AS dp_count FROM demo.people \gset
\echo dp_count=:dp_count
SELECT * FROM demo.people;
SELECT 1 AS after_refusal \gset
\echo after_refusal=:after_refusal
EXPLAIN SELECT clinic, COUNT(*) FROM demo.visits GROUP BY clinic;
