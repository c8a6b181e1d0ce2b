-- R floor: an empty PL/pgSQL function without arguments or attributes (scratch.sql).
SELECT scratch.empty_plain();
