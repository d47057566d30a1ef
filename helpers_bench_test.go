package main

// Shared by the benchmarks (*_bench_test.go): their settings from the
// environment, the medians they report, and the durable PostgreSQL they
// measure against.

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}

func benchEnvInt(b *testing.B, name string, def, atLeast int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < atLeast {
		b.Fatalf("%s=%q: want an integer of at least %d", name, v, atLeast)
	}
	return n
}

// benchEnvInts reads a comma-separated list of positive integers from the
// environment variable name, or def when it is not set.
func benchEnvInts(b *testing.B, name, def string) []int {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var ns []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("%s=%q: want positive integers separated by commas", name, v)
		}
		ns = append(ns, n)
	}
	return ns
}

// benchConfig is the configuration from the environment, so that
// CONSUMER_MAX_POLL_RECORDS, CONSUMER_LINGER etc. can be tried out.
func benchConfig(b *testing.B) Config {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	c, err := loadConfig(os.Getenv, fs, bindConfigFlags(fs))
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// benchLogger logs warnings only: a benchmark shows ten lines of output,
// kept for the results.
func benchLogger(b *testing.B) *slog.Logger {
	return slog.New(slog.NewTextHandler(b.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// newDurableBenchPool is a pool on a migrated database of a managed cluster
// of its own with PostgreSQL's durable defaults (fsync, synchronous_commit),
// unlike the test cluster.
func newDurableBenchPool(b *testing.B) *pgxpool.Pool {
	ctx := context.Background()
	logger := benchLogger(b)
	pg := startTestManagedPostgres(b, managedPostgresOptions{DataDir: filepath.Join(tempDataDir(b), "pg"), Database: "playwatch", OSUser: "postgres"}, logger)
	pool, err := pgxpool.New(ctx, pg.DSN())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if err := migrate(ctx, pool, logger); err != nil {
		b.Fatal(err)
	}
	return pool
}
