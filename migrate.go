package main

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed schema.sql
var schemaSQL string

// migration is one numbered step of schema.sql.
type migration struct {
	Version int
	Name    string
	SQL     string
}

var migrationHeader = regexp.MustCompile(`^-- migration (\d+): (.+)$`)

// parseMigrations splits schema.sql at its "-- migration N: name" lines and
// checks that the numbers run 1, 2, 3… without gaps.
func parseMigrations(src string) ([]migration, error) {
	var ms []migration
	for _, line := range strings.SplitAfter(src, "\n") {
		if m := migrationHeader.FindStringSubmatch(strings.TrimRight(line, "\r\n")); m != nil {
			v, _ := strconv.Atoi(m[1])
			if v != len(ms)+1 {
				return nil, fmt.Errorf("schema.sql: migration %d follows migration %d", v, len(ms))
			}
			ms = append(ms, migration{Version: v, Name: m[2]})
			continue
		}
		if len(ms) > 0 {
			ms[len(ms)-1].SQL += line
		}
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("schema.sql: no migrations")
	}
	return ms, nil
}

// schemaState is what migrateSchema found and did: the database's schema
// version after it, and the migrations it applied.
type schemaState struct {
	Version int
	Applied []int
}

// String is what `playwatch migrate` prints.
func (s schemaState) String() string {
	if len(s.Applied) == 0 {
		return fmt.Sprintf("schema at version %d; nothing to apply", s.Version)
	}
	applied := make([]string, len(s.Applied))
	for i, v := range s.Applied {
		applied[i] = strconv.Itoa(v)
	}
	return fmt.Sprintf("schema at version %d; applied %s", s.Version, strings.Join(applied, ", "))
}

// migrateSchema applies the migrations of schema.sql that the database has
// not recorded yet. An advisory lock makes concurrent starts wait for each
// other, so applying twice, or from two processes, is a no-op.
func migrateSchema(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (schemaState, error) {
	var state schemaState
	ms, err := parseMigrations(schemaSQL)
	if err != nil {
		return state, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return state, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Release()
	const lockKey = 0x706c617977617463 // "playwatc"
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(lockKey)); err != nil {
		return state, fmt.Errorf("migrate: take lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(lockKey))

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS storage_consumer_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return state, fmt.Errorf("migrate: bookkeeping table: %w", err)
	}
	var current int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM storage_consumer_migrations").Scan(&current); err != nil {
		return state, fmt.Errorf("migrate: read version: %w", err)
	}
	if current > len(ms) {
		return state, fmt.Errorf("migrate: the database is at migration %d but this binary knows only %d: run a newer playwatch", current, len(ms))
	}
	state.Version = current
	for _, m := range ms[current:] {
		if err := applyMigration(ctx, conn, m); err != nil {
			if strings.Contains(m.SQL, "CREATE EXTENSION IF NOT EXISTS pg_trgm") && strings.Contains(err.Error(), "pg_trgm") {
				// A server without the contrib package, or a role that may
				// not create extensions: say what to run.
				return state, fmt.Errorf("migration %d (%s): %w: the reviews search needs PostgreSQL's pg_trgm extension; "+
					"install the server's contrib package (postgresql-contrib) and run CREATE EXTENSION pg_trgm; as a superuser in this database, then start playwatch again",
					m.Version, m.Name, err)
			}
			return state, fmt.Errorf("migration %d (%s): %w", m.Version, m.Name, err)
		}
		state.Version, state.Applied = m.Version, append(state.Applied, m.Version)
		logger.Info("applied migration", "version", m.Version, "name", m.Name)
	}
	return state, nil
}

// applyMigration runs migration m and records it in
// storage_consumer_migrations, in one transaction on db.
func applyMigration(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, m migration) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO storage_consumer_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
		return err
	})
}
