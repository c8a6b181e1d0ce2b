-- W2 floor: one round trip that does nothing.
\set k random(1, 4)
SELECT 1;
