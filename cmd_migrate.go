package main

import (
	"context"
	"fmt"
	"io"
)

func cmdMigrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseNoArgs("migrate", "migrate [flags]", args, getenv, stdout, stderr, nil)
	if err != nil {
		return err
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error {
		fmt.Fprintln(stdout, be.schema)
		// The search text of the reviews stored before migration 15 (or with
		// an older normalisation), with its progress in the log.
		_, err := backfillSearchText(ctx, be.pool, cl.logger)
		return err
	})
}
