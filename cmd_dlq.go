package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
)

// cmdDLQ is `playwatch dlq list|replay|discard` (dlq.go).
func cmdDLQ(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && slices.Contains([]string{"help", "-h", "-help", "--help"}, args[0]) {
		fmt.Fprint(stdout, dlqUsage)
		return nil
	}
	if len(args) == 0 || !slices.Contains(dlqSubcommands, args[0]) {
		fmt.Fprint(stderr, dlqUsage)
		return usageError{"dlq needs a subcommand: list, replay or discard"}
	}
	sub := args[0]
	var f dlqFlags
	cl, err := parseCommandLine("dlq "+sub, dlqSynopsis(sub), args[1:], getenv, stdout, stderr, f.register(sub))
	if err != nil {
		return err
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	switch sub {
	case "list":
		err = runDLQList(ctx, be.pool, &f, cl.args, stdout)
	case "discard":
		err = runDLQDiscard(ctx, be.pool, &f, cl.args, stdout)
	default:
		err = runDLQReplay(ctx, newConsumerStore(be.pool, cl.cfg.ConsumerGroup, cl.cfg.Locales), &f, cl.args, cl.cfg.ConsumerMaxRecordBytes, stdout)
	}
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}
