package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"
)

const notifyUsage = `Usage: playwatch notify COMMAND

Commands:
  run     run the notifier role alone: decide events into the outbox and deliver them
`

// cmdNotify dispatches `playwatch notify`.
func cmdNotify(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, notifyUsage)
		return usageError{"notify: no subcommand given"}
	}
	switch args[0] {
	case "run":
		return cmdNotifyRun(ctx, args[1:], getenv, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, notifyUsage)
		return nil
	}
	fmt.Fprint(stderr, notifyUsage)
	return usageError{fmt.Sprintf("notify: unknown subcommand %q", args[0])}
}

// cmdNotifyRun is the notifier role alone, attached to the database of a
// running playwatch (or DATABASE_URL), until a signal.
func cmdNotifyRun(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseCommandLine("notify run", "notify run [flags]", args, getenv, stdout, stderr, nil)
	if err != nil {
		return err
	}
	if len(cl.args) > 0 {
		return usageError{fmt.Sprintf("notify run takes no arguments, got %q", cl.args)}
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	role, err := newNotifierRole(be.pool, cl.cfg, prometheus.NewRegistry(), cl.logger)
	if err != nil {
		return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
	}
	err = role(ctx)
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}
