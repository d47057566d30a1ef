package main

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// newTestPoolAtVersion is a pool on a fresh database, dropped when the test
// ends, with the migrations of schema.sql applied up to version as
// migrateSchema applies them (one transaction each, recorded), so that a
// later migrateSchema goes on from there; then the statements of fill run,
// to write rows as a playwatch of that version did.
func newTestPoolAtVersion(t *testing.T, version int, fill ...string) *pgxpool.Pool {
	t.Helper()
	if err := testPG.start(); err != nil {
		t.Fatalf("test postgres: %v", err)
	}
	ctx := context.Background()
	name := fmt.Sprintf("pwt_%d_%d", os.Getpid(), testPG.seq.Add(1))
	if err := testPG.exec(ctx, "CREATE DATABASE "+name+" TEMPLATE template0"+testPG.owner); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		if err := testPG.exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	pool := newTestPoolFor(t, testPG.urlFor(name))
	ms, err := parseMigrations(schemaSQL)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `CREATE TABLE storage_consumer_migrations (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`)
	for _, m := range ms[:version] {
		if err := applyMigration(ctx, pool, m); err != nil {
			t.Fatalf("migration %d: %v", m.Version, err)
		}
	}
	for _, sql := range fill {
		mustExec(t, pool, sql)
	}
	return pool
}

// holdDataDir locks dataDir for the rest of the test, as the appliance that
// owns it does.
func holdDataDir(t *testing.T, dataDir string) {
	t.Helper()
	release, err := lockDataDir(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
}
