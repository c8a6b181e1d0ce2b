// Package hostile is the hostile-tenant mode of the robustness suite. On
// one throwaway PostgreSQL, with pg_lease installed by a superuser, the
// honest parts of the product run, each as a database role of its own with
// what an application gets: pkg/elector electors, client-go's
// LeaderElector over pkg/resourcelock, a pkg/shard controller, two
// processes handing a key to each other through pkg/handover, and probes
// of free keys. Beside them, hostile roles (EXECUTE only; one also with
// CREATE on the database) act at random, seeded: transactions left open
// after any call, renew_many and listen over the honest keys, candidates
// at the highest priority and strategies on them, the honest processes'
// owner strings, forged pg_lease notifications, acquire/release floods,
// and objects squatted where an installer may call them.
//
// The checks are about honest outcomes, judged from observed events and
// never from timing:
//
//  1. a key read free is granted to an honest wait-0 acquire;
//  2. a release hands its key only to a candidate of the releasing role;
//  3. no honest client sends more than ten times what its cadence makes
//     it send;
//  4. registrations, candidates, strategies and history stay within the
//     documented caps;
//  5. the epochs each honest party observes only grow;
//  6. no two honest parties believe they hold one key at the same time;
//  7. client-go's IsLeader is false while the key is not held by its role;
//  8. no honest call waits for a lock that another role's call left
//     behind in an open transaction;
//  9. an installer never runs another role's functions, nor reports
//     another role's objects as pg_lease.
//
// Every violation is reported with the run's seed.
package hostile
