package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
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
)

var notifyUsage = usageOf(notifyRunSynopsis, notifyListSynopsis, notifyRetrySynopsis)

func cmdNotify(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return commandGroup{usage: notifyUsage, subs: map[string]commandFunc{"run": cmdNotifyRun, "list": cmdNotifyList, "retry": cmdNotifyRetry},
		missing: "notify needs a subcommand: run, list or retry",
		unknown: "notify: unknown subcommand %q (known: run, list, retry)"}.run(ctx, args, getenv, stdout, stderr)
}

// cmdNotifyRun is the notifier role alone, attached to the database of a
// running playwatch (or DATABASE_URL), until a signal.
func cmdNotifyRun(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cl, err := parseNoArgs("notify run", notifyRunSynopsis, args, getenv, stdout, stderr, nil)
	if err != nil {
		return err
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error {
		role, err := newNotifierRole(be.pool, cl.cfg, prometheus.NewRegistry(), cl.logger)
		if err != nil {
			return err
		}
		return role(ctx)
	})
}

func cmdNotifyList(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var status string
	var rule, dest int64
	var limit int
	cl, err := parseNoArgs("notify list", notifyListSynopsis, args, getenv, stdout, stderr, func(fs *flag.FlagSet) {
		fs.StringVar(&status, "status", "", "only notifications of this status: pending, sent or failed")
		fs.Int64Var(&rule, "rule", 0, "only those of this rule id")
		fs.Int64Var(&dest, "destination", 0, "only those to this destination id")
		fs.IntVar(&limit, "limit", defaultNotificationLimit, fmt.Sprintf("at most this many, newest first (1 to %d)", maxNotificationLimit))
	})
	switch {
	case err != nil:
		return err
	case status != "" && !slices.Contains(notificationStatuses, status):
		return usageError{fmt.Sprintf("--status must be pending, sent or failed, not %q", status)}
	case rule < 0 || dest < 0:
		return usageError{"--rule and --destination take a positive id"}
	case limit < 1 || limit > maxNotificationLimit:
		return usageError{fmt.Sprintf("--limit must be from 1 to %d", maxNotificationLimit)}
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error {
		return runNotifyList(ctx, be.pool, notificationFilter{Status: status, RuleID: rule, DestinationID: dest, Limit: limit}, stdout)
	})
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
	ids, err := parseIDs("notify retry", "notification", cl.args)
	if err != nil {
		return err
	}
	if failed == (len(ids) > 0) {
		return usageError{"notify retry needs --failed or notification ids, not both"}
	}
	return cl.attach(ctx, backendOptions{}, func(be *backends) error { return runNotifyRetry(ctx, be.pool, ids, stdout) })
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
