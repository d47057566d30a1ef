package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"
)

const rollupUsage = `Usage: playwatch rollup COMMAND

Commands:
  rebuild [--package P]   recompute the rollups from the stored reviews and listings, app by app
  check                   compare the rollups with the stored reviews and listings; print the differences
`

// rollupProgressEvery is how often `rollup rebuild` prints its progress.
const rollupProgressEvery = 5 * time.Second

// cmdRollup dispatches `playwatch rollup`.
func cmdRollup(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, rollupUsage)
		return usageError{"rollup: no subcommand given"}
	}
	switch args[0] {
	case "rebuild":
		return cmdRollupRebuild(ctx, args[1:], getenv, stdout, stderr)
	case "check":
		return cmdRollupCheck(ctx, args[1:], getenv, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, rollupUsage)
		return nil
	}
	fmt.Fprint(stderr, rollupUsage)
	return usageError{fmt.Sprintf("rollup: unknown subcommand %q", args[0])}
}

func cmdRollupRebuild(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var pkg string
	cl, err := parseCommandLine("rollup rebuild", "rollup rebuild [--package P] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&pkg, "package", "", "rebuild only this app's rollups")
	})
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("rollup rebuild takes no arguments, got %q", cl.args)}
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	start := time.Now()
	last := start
	n, err := rebuildRollups(ctx, be.pool, pkg, func(done, total int, pkg string) {
		if now := time.Now(); done == 1 || done == total || now.Sub(last) >= rollupProgressEvery {
			last = now
			fmt.Fprintf(stderr, "rebuilt the rollups of %d of %d apps (%s)\n", done, total, pkg)
		}
	})
	if err == nil {
		fmt.Fprintf(stdout, "rebuilt the rollups of %d apps in %s\n", n, time.Since(start).Round(time.Millisecond))
	}
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}

func cmdRollupCheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseCommandLine("rollup check", "rollup check [flags]", args, getenv, stdout, stderr, nil)
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("rollup check takes no arguments, got %q", cl.args)}
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	diffs, err := checkRollups(ctx, be.pool)
	if err == nil {
		for _, d := range diffs {
			fmt.Fprintf(stdout, "%s %s: rollup %s, raw tables %s\n", d.Table, d.Key, orNone(d.Got), orNone(d.Want))
		}
		if len(diffs) > 0 {
			err = fmt.Errorf("%d differences (at most %d per table shown): %w", len(diffs), rollupCheckLimit, errRollupDiffers)
		} else {
			fmt.Fprintln(stdout, "the rollups match the raw tables")
		}
	}
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}

// orNone names an absent row.
func orNone(s string) string {
	if s == "" {
		return "(no row)"
	}
	return s
}
