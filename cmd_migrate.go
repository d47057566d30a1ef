package main

import (
	"context"
	"errors"
	"fmt"
	"io"
)

func cmdMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseCommandLine("migrate", "migrate [flags]", args, getenv, stdout, stderr, nil)
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("migrate takes no arguments, got %q", cl.args)}
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, be.schema)
	// The search text of the reviews stored before migration 15 (or with
	// an older normalisation), with its progress in the log.
	_, err = backfillSearchText(ctx, be.pool, cl.logger)
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}
