-- 50_released_scripts: every shipped script, run by naming a version, calls
-- nothing another role planted. A role whose only privilege is CREATE on
-- schema public (every role's default before PostgreSQL 15) plants
-- functions and operators there that the released scripts would resolve
-- through search_path if they did not pin it: format() with the argument
-- types of the calls in their DO blocks, and the comparisons of oid with
-- integer, regclass and regnamespace there. Each records that it ran, tries
-- to make the planter superuser, and returns pg_catalog's answer, so a
-- script that called it would still succeed. Then a superuser (and a
-- database owner, for a trusted install) installs every version by name and
-- runs every update that pg_extension_update_paths offers: nothing planted
-- runs.
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT current_database() AS orig_db \gset

CREATE ROLE regress_pglease_planter;
CREATE ROLE regress_pglease_dbowner;
CREATE DATABASE regress_pglease_released OWNER regress_pglease_dbowner;
\c regress_pglease_released
GRANT CREATE ON SCHEMA public TO regress_pglease_planter, regress_pglease_dbowner;

-- What the checks read (made before anything is planted).
CREATE TABLE public.shadow_ran (what text, by_role text);
GRANT INSERT ON public.shadow_ran TO PUBLIC;
CREATE TABLE public.updates_run (source text, target text);
CREATE VIEW public.after AS
  SELECT (SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname = 'pg_lease') AS installed,
         (SELECT count(*) FROM public.shadow_ran) AS shadow_calls,
         (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.rolname = 'regress_pglease_planter') AS planter_superuser;

SET ROLE regress_pglease_planter;
CREATE FUNCTION public.shadow(what text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO public.shadow_ran VALUES (what, current_user);
  BEGIN
    EXECUTE 'ALTER ROLE regress_pglease_planter SUPERUSER';
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
END
$$;
CREATE FUNCTION public.format(text, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.shadow('format(text, text)'); RETURN pg_catalog.format($1, $2); END $$;
CREATE FUNCTION public.format(text, text, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.shadow('format(text, text, text)'); RETURN pg_catalog.format($1, $2, $3); END $$;
CREATE FUNCTION public.format(text, text, text, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.shadow('format(text, text, text, text)'); RETURN pg_catalog.format($1, $2, $3, $4); END $$;
CREATE FUNCTION public.format(text, regclass) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.shadow('format(text, regclass)'); RETURN pg_catalog.format($1, $2); END $$;
CREATE FUNCTION public.format(text, regprocedure) RETURNS text LANGUAGE plpgsql AS $$
BEGIN PERFORM public.shadow('format(text, regprocedure)'); RETURN pg_catalog.format($1, $2); END $$;
CREATE FUNCTION public.oid_ne_int(oid, integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.shadow('oid <> integer'); RETURN $1 OPERATOR(pg_catalog.<>) $2::oid; END $$;
CREATE OPERATOR public.<> (LEFTARG = oid, RIGHTARG = integer, FUNCTION = public.oid_ne_int);
CREATE FUNCTION public.oid_eq_regclass(oid, regclass) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.shadow('oid = regclass'); RETURN $1 OPERATOR(pg_catalog.=) $2::oid; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = public.oid_eq_regclass);
CREATE FUNCTION public.oid_eq_regnamespace(oid, regnamespace) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN PERFORM public.shadow('oid = regnamespace'); RETURN $1 OPERATOR(pg_catalog.=) $2::oid; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regnamespace, FUNCTION = public.oid_eq_regnamespace);
RESET ROLE;

-- The planted objects do win where pg_catalog has no exact match: an
-- unpinned call would run them (rolled back, so nothing is recorded).
BEGIN;
SELECT format('%s', 'x'::text) AS planted_format, 0::oid <> 1 AS planted_operator;
SELECT what FROM public.shadow_ran ORDER BY what;
ROLLBACK;

-- Every version installed by name, by a superuser.
CREATE EXTENSION pg_lease VERSION '0.1.0';
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.2.0';
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.3.0';
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.4.0';
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease;
SELECT * FROM public.after;
DROP EXTENSION pg_lease;

-- Every update pg_extension_update_paths offers, each from a fresh install
-- of its source version; 0.1.0 is also updated one release at a time.
CREATE EXTENSION pg_lease VERSION '0.1.0';
ALTER EXTENSION pg_lease UPDATE TO '0.2.0';
INSERT INTO public.updates_run VALUES ('0.1.0', '0.2.0');
SELECT * FROM public.after;
ALTER EXTENSION pg_lease UPDATE TO '0.3.0';
INSERT INTO public.updates_run VALUES ('0.2.0', '0.3.0');
SELECT * FROM public.after;
ALTER EXTENSION pg_lease UPDATE TO '0.4.0';
INSERT INTO public.updates_run VALUES ('0.3.0', '0.4.0');
SELECT * FROM public.after;
ALTER EXTENSION pg_lease UPDATE TO '0.5.0';
INSERT INTO public.updates_run VALUES ('0.4.0', '0.5.0');
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.1.0';
ALTER EXTENSION pg_lease UPDATE TO '0.3.0';
INSERT INTO public.updates_run VALUES ('0.1.0', '0.3.0');
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.1.0';
ALTER EXTENSION pg_lease UPDATE TO '0.4.0';
INSERT INTO public.updates_run VALUES ('0.1.0', '0.4.0');
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.1.0';
ALTER EXTENSION pg_lease UPDATE TO '0.5.0';
INSERT INTO public.updates_run VALUES ('0.1.0', '0.5.0');
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.2.0';
ALTER EXTENSION pg_lease UPDATE TO '0.4.0';
INSERT INTO public.updates_run VALUES ('0.2.0', '0.4.0');
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.2.0';
ALTER EXTENSION pg_lease UPDATE TO '0.5.0';
INSERT INTO public.updates_run VALUES ('0.2.0', '0.5.0');
SELECT * FROM public.after;
DROP EXTENSION pg_lease;
CREATE EXTENSION pg_lease VERSION '0.3.0';
ALTER EXTENSION pg_lease UPDATE TO '0.5.0';
INSERT INTO public.updates_run VALUES ('0.3.0', '0.5.0');
SELECT * FROM public.after;
DROP EXTENSION pg_lease;

-- A trusted install by the database owner (the scripts run as the bootstrap
-- superuser), at a released version, then updated.
SET ROLE regress_pglease_dbowner;
CREATE EXTENSION pg_lease VERSION '0.3.0';
ALTER EXTENSION pg_lease UPDATE;
RESET ROLE;
SELECT * FROM public.after;
DROP EXTENSION pg_lease;

-- Every update path was taken; what ran of the planted objects (nothing).
SELECT p.source, p.target FROM pg_catalog.pg_extension_update_paths('pg_lease') p
 WHERE p.path IS NOT NULL
EXCEPT SELECT u.source, u.target FROM public.updates_run u;
SELECT what, by_role, count(*) AS calls FROM public.shadow_ran GROUP BY what, by_role ORDER BY what, by_role;

\c :orig_db
DROP DATABASE regress_pglease_released;
DROP ROLE regress_pglease_planter;
DROP ROLE regress_pglease_dbowner;
