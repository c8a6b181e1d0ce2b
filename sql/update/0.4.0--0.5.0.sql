-- State 0.4.0 -> 0.5.0.

-- The shared part creates lease.configure(interval, text) anew (it drops
-- only 0.3.0's configure(interval) itself): drop 0.4.0's first.
DROP FUNCTION IF EXISTS lease.configure(interval, text);
