// Package leaseadmin is what an operator runs and reads: it installs or
// updates pg_lease in a database (InstallExtension, InstallSchema), tells
// which version is installed, by whom, and whether the current role can
// trust it (Installed, Describe), frees a key from its holder
// (ForceRelease), removes long-free keys (Cleanup), and reads a key's
// recorded leadership changes (History), every key's health (Health) and
// the database's configuration (ReadSettings).
//
// Installing and inspecting read the catalogs first and call nothing in
// schema lease unless the current role can trust it: the schema and its
// functions belong to the extension (for a schema-only install: a
// lease.version() as pg_lease writes it), and the owner of every object in
// it can already act as this role (it is this role, a superuser, or a member
// of this role). A schema lease that another role prepared gives
// ErrSquatted, and nothing in it runs. Cleanup and ForceRelease check the
// same before their call. History, Health and ReadSettings call pg_lease's
// functions as every lease.Client call does, trusting the schema's owner.
//
// Install before the first lease.Client call, then read through the client:
//
//	if err := leaseadmin.InstallExtension(ctx, pool); err != nil {
//		return err // ErrVersionMismatch: a newer SQL is installed; ErrSquatted: another role's schema lease
//	}
//	c := lease.New(pool)
//	events, err := leaseadmin.History(ctx, c, "controller", 20)
package leaseadmin
