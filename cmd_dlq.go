package main

import (
	"context"
	"io"
)

// cmdDLQ is `playwatch dlq list|replay|discard` (dlq.go).
func cmdDLQ(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return commandGroup{usage: dlqUsage, subs: subcommandsOf(dlqSubcommands, cmdDLQSubcommand),
		missing: "dlq needs a subcommand: list, replay or discard"}.run(ctx, args, getenv, stdout, stderr)
}

// cmdDLQSubcommand is one of them, on the database of the playwatch it
// attaches to.
func cmdDLQSubcommand(ctx context.Context, sub string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var f dlqFlags
	cl, err := parseCommandLine("dlq "+sub, dlqSynopsis(sub), args, getenv, stdout, stderr, f.register(sub))
	if err != nil {
		return err
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error {
		switch sub {
		case "list":
			return runDLQList(ctx, be.pool, &f, cl.args, stdout)
		case "discard":
			return runDLQDiscard(ctx, be.pool, &f, cl.args, stdout)
		default:
			return runDLQReplay(ctx, newConsumerStore(be.pool, cl.cfg.ConsumerGroup, cl.cfg.Locales), &f, cl.args, cl.cfg.ConsumerMaxRecordBytes, stdout)
		}
	})
}
