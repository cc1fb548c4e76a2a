-- psql with ON_ERROR_STOP against pgdp: the refusal stops the script (exit status 3).
\set ON_ERROR_STOP on
\set VERBOSITY verbose
SELECT 1 AS before \gset
\echo before=:before
SELECT * FROM demo.people;
\echo not_reached
