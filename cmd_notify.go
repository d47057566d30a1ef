package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// `playwatch notify …`: the notifier's commands.

const (
	notifyRunSynopsis   = "notify run [flags]"
	notifyListSynopsis  = "notify list [--status pending|sent|failed] [--rule ID] [--destination ID] [--limit N] [flags]"
	notifyRetrySynopsis = "notify retry [flags] (--failed | ID...)"
	notifyUsage         = "Usage:\n  playwatch " + notifyRunSynopsis + "\n  playwatch " + notifyListSynopsis + "\n  playwatch " + notifyRetrySynopsis + "\n"
)

func cmdNotify(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && slices.Contains([]string{"help", "-h", "-help", "--help"}, args[0]) {
		fmt.Fprint(stdout, notifyUsage)
		return nil
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, notifyUsage)
		return usageError{"notify needs a subcommand: run, list or retry"}
	}
	switch sub, rest := args[0], args[1:]; sub {
	case "run":
		return cmdNotifyRun(ctx, rest, getenv, stdout, stderr)
	case "list":
		return cmdNotifyList(ctx, rest, getenv, stdout, stderr)
	case "retry":
		return cmdNotifyRetry(ctx, rest, getenv, stdout, stderr)
	default:
		fmt.Fprint(stderr, notifyUsage)
		return usageError{fmt.Sprintf("notify: unknown subcommand %q (known: run, list, retry)", sub)}
	}
}

// cmdNotifyRun is the notifier role alone, attached to the database of a
// running playwatch (or DATABASE_URL), until a signal.
func cmdNotifyRun(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseCommandLine("notify run", notifyRunSynopsis, args, getenv, stdout, stderr, nil)
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

func cmdNotifyList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var status string
	var rule, dest int64
	var limit int
	cl, err := parseCommandLine("notify list", notifyListSynopsis, args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&status, "status", "", "only notifications of this status: pending, sent or failed")
		fs.Int64Var(&rule, "rule", 0, "only those of this rule id")
		fs.Int64Var(&dest, "destination", 0, "only those to this destination id")
		fs.IntVar(&limit, "limit", defaultNotificationLimit, fmt.Sprintf("at most this many, newest first (1 to %d)", maxNotificationLimit))
	})
	if err != nil {
		return err
	}
	switch {
	case len(cl.args) > 0:
		return usageError{fmt.Sprintf("notify list takes no arguments, got %q", cl.args)}
	case status != "" && !slices.Contains(notificationStatuses, status):
		return usageError{fmt.Sprintf("--status must be pending, sent or failed, not %q", status)}
	case rule < 0 || dest < 0:
		return usageError{"--rule and --destination take a positive id"}
	case limit < 1 || limit > maxNotificationLimit:
		return usageError{fmt.Sprintf("--limit must be from 1 to %d", maxNotificationLimit)}
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	err = runNotifyList(ctx, be.pool, notificationFilter{Status: status, RuleID: rule, DestinationID: dest, Limit: limit}, stdout)
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}

// runNotifyList prints the outbox rows f picks as a table.
func runNotifyList(ctx context.Context, pool *pgxpool.Pool, f notificationFilter, stdout io.Writer) error {
	ns, err := listNotifications(ctx, pool, f)
	if err != nil {
		return err
	}
	if len(ns) == 0 {
		fmt.Fprintln(stdout, "no notifications")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tRULE\tDESTINATION\tEVENT\tSTATUS\tATTEMPTS\tCREATED\tSENT\tEVENT KEY\tLAST ERROR")
	for _, n := range ns {
		sent := "-"
		if n.SentAt != nil {
			sent = n.SentAt.UTC().Format(time.RFC3339)
		}
		lastErr := "-"
		if n.LastError != nil {
			// One line per row, whatever the receiver answered.
			lastErr = strings.Join(strings.Fields(*n.LastError), " ")
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", n.ID, n.RuleID, n.DestinationID, n.Event, n.Status, n.Attempts,
			n.CreatedAt.UTC().Format(time.RFC3339), sent, n.EventKey, lastErr)
	}
	return tw.Flush()
}

func cmdNotifyRetry(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var failed bool
	cl, err := parseCommandLine("notify retry", notifyRetrySynopsis, args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.BoolVar(&failed, "failed", false, "send every failed notification again")
	})
	if err != nil {
		return err
	}
	var ids []int64
	for _, a := range cl.args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id < 1 {
			return usageError{fmt.Sprintf("notify retry: %q is not a notification id", a)}
		}
		ids = append(ids, id)
	}
	if failed == (len(ids) > 0) {
		return usageError{"notify retry needs --failed or notification ids, not both"}
	}
	be, err := openBackends(ctx, cl.cfg, cl.logger, backendOptions{attach: true})
	if err != nil {
		return err
	}
	err = runNotifyRetry(ctx, be.pool, ids, stdout)
	return errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout))
}

// runNotifyRetry puts failed notifications (ids nil: every one; else the
// given ones, whatever their status but sent) back into the outbox, due
// now with a fresh count of attempts and a fresh NOTIFY_GIVE_UP (from
// retry_from), and prints how many. A digest goes again with the rows it
// stands for; a row of a digest retried without it goes alone.
func runNotifyRetry(ctx context.Context, pool *pgxpool.Pool, ids []int64, stdout io.Writer) error {
	var n, asked int64
	err := pool.QueryRow(ctx, `WITH picked AS (
	SELECT id, event FROM notifications
	WHERE CASE WHEN $1::bigint[] IS NULL THEN status = 'failed' ELSE id = ANY($1) AND status <> 'sent' END
), again AS (
	UPDATE notifications n SET status = 'pending', next_attempt_at = now(), attempts = 0, retry_from = now(), last_error = NULL,
		digest_id = CASE WHEN n.digest_id IN (SELECT id FROM picked WHERE event = 'digest') THEN n.digest_id END
	WHERE n.id IN (SELECT id FROM picked)
		OR (n.status <> 'sent' AND n.digest_id IN (SELECT id FROM picked WHERE event = 'digest'))
	RETURNING n.id
)
SELECT (SELECT count(*) FROM again), (SELECT count(*) FROM picked)`, ids).Scan(&n, &asked)
	if err != nil {
		return fmt.Errorf("retry notifications: %w", err)
	}
	fmt.Fprintf(stdout, "%d notifications pending again\n", n)
	if ids != nil && int(asked) < len(ids) {
		fmt.Fprintf(stdout, "%d of the ids given are unknown or already sent\n", len(ids)-int(asked))
	}
	return nil
}
