package main

import (
	"context"
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
	return commandGroup{usage: rollupUsage, subs: map[string]commandFunc{"rebuild": cmdRollupRebuild, "check": cmdRollupCheck},
		missing: "rollup: no subcommand given", unknown: "rollup: unknown subcommand %q"}.run(ctx, args, getenv, stdout, stderr)
}

func cmdRollupRebuild(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var pkg string
	cl, err := parseNoArgs("rollup rebuild", "rollup rebuild [--package P] [flags]", args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&pkg, "package", "", "rebuild only this app's rollups")
	})
	if err != nil {
		return err
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error {
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
		return err
	})
}

func cmdRollupCheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseNoArgs("rollup check", "rollup check [flags]", args, getenv, stdout, stderr, nil)
	if err != nil {
		return err
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error {
		diffs, err := checkRollups(ctx, be.pool)
		if err != nil {
			return err
		}
		for _, d := range diffs {
			fmt.Fprintf(stdout, "%s %s: rollup %s, raw tables %s\n", d.Table, d.Key, orNone(d.Got), orNone(d.Want))
		}
		if len(diffs) > 0 {
			return fmt.Errorf("%d differences (at most %d per table shown): %w", len(diffs), rollupCheckLimit, errRollupDiffers)
		}
		fmt.Fprintln(stdout, "the rollups match the raw tables")
		return nil
	})
}

// orNone names an absent row.
func orNone(s string) string {
	if s == "" {
		return "(no row)"
	}
	return s
}
