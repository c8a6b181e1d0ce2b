// Package leaseadmin is what an operator runs and reads: it installs or
// updates pg_lease in a database (InstallExtension, InstallSchema), tells
// which version is installed (Installed), frees a key from its holder
// (ForceRelease), removes long-free keys (Cleanup), and reads a key's
// recorded leadership changes (History), every key's health (Health) and
// the database's configuration (ReadSettings).
//
// Install before the first lease.Client call, then read through the client:
//
//	if err := leaseadmin.InstallExtension(ctx, pool); err != nil {
//		return err // errors.Is(err, leaseadmin.ErrVersionMismatch): a newer SQL is installed
//	}
//	c := lease.New(pool)
//	events, err := leaseadmin.History(ctx, c, "controller", 20)
package leaseadmin
