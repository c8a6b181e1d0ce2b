package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pg_lease/pkg/fence"
	"github.com/pglease/pg_lease/pkg/lease"
)

// The store's tables. operator_fence is the guard's (highest accepted epoch
// per resource); operator_results holds the latest accepted result per
// ConfigMap; operator_audit gets a row for every accepted write, in
// acceptance order per resource (seq: the guard's row lock serializes the
// writers of one resource, and the audit row is inserted under it).
const schemaSQL = `
CREATE TABLE IF NOT EXISTS operator_results (
  resource         text PRIMARY KEY,
  epoch            bigint NOT NULL,
  writer           text NOT NULL,
  resource_version text NOT NULL,
  data             jsonb NOT NULL,
  digest           text NOT NULL,
  written_at       timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS operator_audit (
  seq              bigserial PRIMARY KEY,
  resource         text NOT NULL,
  epoch            bigint NOT NULL,
  writer           text NOT NULL,
  resource_version text NOT NULL,
  digest           text NOT NULL,
  accepted_at      timestamptz NOT NULL DEFAULT clock_timestamp());`

// schemaLock serializes the replicas' CREATE TABLE IF NOT EXISTS (which
// does not cover concurrent creators) in the store database.
const schemaLock = 0x70676c65617365 // "pglease"

type store struct {
	pool  *pgxpool.Pool
	guard *fence.PGGuard
}

func newStore(ctx context.Context, pool *pgxpool.Pool) (*store, error) {
	guard, err := fence.NewPGGuard(pool, fence.PGGuardOptions{Table: "operator_fence"})
	if err != nil {
		return nil, err
	}
	if err := guard.EnsureTable(ctx); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(schemaLock)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schemaSQL)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: creating tables: %w", err)
	}
	return &store{pool: pool, guard: guard}, nil
}

// result is what one reconcile writes.
type result struct {
	Resource        string // namespace/name
	Writer          string
	ResourceVersion string
	Data            map[string]string
	Digest          string
}

// write records r under tok's epoch: the guard's conditional write, the
// result row and the audit row commit together, or a *fence.StaleError says
// that a higher epoch was accepted for the resource before.
func (s *store) write(ctx context.Context, tok lease.Token, r result) error {
	data, err := json.Marshal(r.Data)
	if err != nil {
		return err
	}
	return s.guard.WriteResource(ctx, r.Resource, tok, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `
INSERT INTO operator_results (resource, epoch, writer, resource_version, data, digest)
VALUES ($1, $2, $3, $4, $5::jsonb, $6)
ON CONFLICT (resource) DO UPDATE SET epoch = EXCLUDED.epoch, writer = EXCLUDED.writer,
  resource_version = EXCLUDED.resource_version, data = EXCLUDED.data, digest = EXCLUDED.digest,
  written_at = clock_timestamp()`,
			r.Resource, tok.Epoch, r.Writer, r.ResourceVersion, string(data), r.Digest); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
INSERT INTO operator_audit (resource, epoch, writer, resource_version, digest) VALUES ($1, $2, $3, $4, $5)`,
			r.Resource, tok.Epoch, r.Writer, r.ResourceVersion, r.Digest)
		return err
	})
}
