package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
)

// managedPGListen is PLAYWATCH_PG_LISTEN when playwatch runs the cluster.
func managedPGListen(cfg Config) string {
	if cfg.DatabaseURL != "" {
		return ""
	}
	return cfg.PGListen
}

// cmdDBURL is `playwatch db-url`: the writer's URL, or the reader's, of the
// managed cluster, with its generated password (postgres_access.go).
func cmdDBURL(_ context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var reader bool
	cl, err := parseNoArgs("db-url", "db-url [--reader] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&reader, "reader", false, "the URL of the read-only role "+pgReaderRole+" (dashboards) instead of the writer "+pgWriterRole)
	})
	if err != nil {
		return err
	}
	role := pgWriterRole
	if reader {
		role = pgReaderRole
	}
	if cl.cfg.DatabaseURL != "" {
		return errors.New("DATABASE_URL is set: playwatch uses that database, not a managed cluster")
	}
	// Like every command that attaches: the URL of a cluster that runs, at
	// the address it listens on, or none.
	r, err := findRunning(cl.cfg.DataDir)
	if errors.Is(err, errNotRunning) {
		return fmt.Errorf("%w: start `playwatch run` on it, or point PLAYWATCH_DATA_DIR at the data directory of a running playwatch", err)
	}
	if err != nil {
		return err
	}
	if !r.ManagedPostgres {
		return fmt.Errorf("the playwatch that runs on %s uses its DATABASE_URL, not a managed cluster", cl.cfg.DataDir)
	}
	cl.cfg.PGListen = r.PGListen
	u, err := managedClusterURL(cl.cfg, role)
	if err != nil {
		return err
	}
	if cl.cfg.PGListen == "" {
		fmt.Fprintln(stderr, "playwatch: PLAYWATCH_PG_LISTEN is empty, so this is the unix socket's URL: only root and the OS user that runs the server can use it")
	} else if !reader && !isLoopback(cl.cfg.PGListen) && !r.PGWriterFrom {
		fmt.Fprintln(stderr, "playwatch: beyond loopback the cluster admits "+pgWriterRole+" only from the networks of PLAYWATCH_PG_WRITER_FROM; other hosts get "+pgReaderRole+" (db-url --reader)")
	}
	fmt.Fprintln(stdout, u)
	return nil
}
