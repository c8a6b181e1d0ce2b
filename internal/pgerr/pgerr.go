// Package pgerr reads the server error (a *pgconn.PgError) in an error's
// chain. It links no test code, so cmd/pglease and the test suites share it.
package pgerr

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// Code is the SQLSTATE of the server error in err's chain, or "".
func Code(err error) string {
	if pg, ok := As(err); ok {
		return pg.Code
	}
	return ""
}

// Message is the message of the server error in err's chain, or "".
func Message(err error) string {
	if pg, ok := As(err); ok {
		return pg.Message
	}
	return ""
}

// As is the server error in err's chain, if there is one.
func As(err error) (*pgconn.PgError, bool) {
	var pg *pgconn.PgError
	ok := errors.As(err, &pg)
	return pg, ok
}
