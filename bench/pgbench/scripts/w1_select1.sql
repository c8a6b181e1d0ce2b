-- W1 floor: three round trips that do nothing.
SELECT 1;
SELECT 1;
SELECT 1;
