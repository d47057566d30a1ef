// Command playwatch watches Google Play apps: a registry of apps, an hourly
// crawler, a Kafka pipeline into PostgreSQL and a pcap analyzer, in one binary.
//
// main.go is the entry point: the command table and the command-line
// helpers every command shares. Each command has its own cmd_*.go file;
// backends.go is the one wiring place that builds real objects (database
// pools, Kafka clients, the broker) and hands them to the roles.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		fmt.Fprintf(os.Stderr, "playwatch: %s received, shutting down (send it again to exit at once)\n", s)
		cancel()
		<-sigs
		fmt.Fprintln(os.Stderr, "playwatch: second signal, exiting without finishing the shutdown")
		os.Exit(130)
	}()
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	cancel()
	os.Exit(exitStatus(err, os.Stderr))
}

// exitStatus reports what run returned on stderr, the error first, and is
// the exit status for it: 2 for a wrong command line, 1 for another error.
func exitStatus(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "playwatch:", err)
	var herr helpError
	if errors.As(err, &herr) {
		fmt.Fprint(stderr, "\n"+herr.help)
	}
	var uerr usageError
	if errors.As(err, &uerr) {
		return 2
	}
	return 1
}

// usageError is a wrong command line; main exits with status 2 for it.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// helpError is a usage error that main follows with help, after the error.
type helpError struct {
	usageError
	help string
}

func (e helpError) Unwrap() error { return e.usageError }

const usageText = `playwatch watches Google Play apps: a registry, an hourly crawler, Kafka and PostgreSQL.

Usage:
  playwatch run [--roles registry,crawler,consumer,sentiment,notifier] [flags]
                                             run the appliance (all roles unless --roles picks some)
  playwatch crawl [--once] [flags]           the crawler role alone (--once: plan one cycle now, crawl it, print a summary)
  playwatch fetch [--lang L --country C] [--reviews N] [--max-wait D] PACKAGE
                                             read one app from the Play Store and print its messages as JSON lines
  playwatch migrate [flags]                  apply the database migrations and exit
  playwatch pcap --app PKG --scenario UPLOAD|DOWNLOAD [--dry-run] FILE...
                                             analyse captures into network-metrics messages
  playwatch dlq list|replay|discard [flags]  list dead letters, store them again once their cause is fixed, or discard them
  playwatch sentiment run|rescore [flags]    score stored reviews' sentiment alone, or mark them for re-scoring
  playwatch sentiment classify [--lang auto|fa|en] [--json] [--model embedded|db]
                                             label review texts from stdin (no database, no broker, but with --model db)
  playwatch sentiment adapt [--min-per-class N] [--dry-run] [flags]
                                             train on the stored reviews' stars; keep the model only if it is better
  playwatch notify run [flags]               run the notifier role alone (decide and deliver notifications)
  playwatch notify list [--status S] [--rule ID] [--destination ID] [--limit N]
                                             show the notifications of the outbox, newest first
  playwatch notify retry ID...|--failed      send failed (or the given) notifications again
  playwatch rollup rebuild [--package P]     recompute the status page's rollups from the stored reviews and listings
  playwatch rollup check                     compare the rollups with the stored reviews and listings
  playwatch reparse [--since 24h] [--until T] [--package P] [--dry-run]
                                             parse the archived raw pages again and publish their messages
  playwatch export reviews|stats [--package P] [--q Q] [--stars S] [--sentiment L] [--since D] [--until T] [--format csv|ndjson|json] [--output FILE]
                                             export reviews or an app's listing history from the database
  playwatch db-url [--reader]                print a URL of the managed PostgreSQL (for psql, dashboards)
  playwatch version                          print the version and exit

Each environment variable ('playwatch --help' lists them) has a flag that overrides it;
'playwatch COMMAND --help' shows a command's own flags and the variables it reads.
`

// run is the whole program; main only adds the process: signals, exit codes.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	err := runCommand(ctx, args, getenv, stdout, stderr)
	switch {
	case errors.Is(err, errHelp):
		return nil // a command's --help printed its usage
	case err != nil:
		// Whatever an error quotes (a library's error may quote a URL it
		// could not read), no secret of the settings shows.
		if text := commandSecrets(args, getenv).redact(err.Error()); text != err.Error() {
			return redactedError{err, text}
		}
	}
	return err
}

// redactedError is an error whose text had secrets, shown without them.
type redactedError struct {
	err  error
	text string
}

func (e redactedError) Error() string { return e.text }
func (e redactedError) Unwrap() error { return e.err }

func runCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return helpError{usageError{"no command given"}, usageText}
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "run":
		return cmdRun(ctx, rest, getenv, stdout, stderr)
	case "migrate":
		return cmdMigrate(ctx, rest, getenv, stdout, stderr)
	case "pcap":
		return cmdPcap(ctx, rest, getenv, stdout, stderr)
	case "crawl":
		return cmdCrawl(ctx, rest, getenv, stdout, stderr)
	case "fetch":
		return cmdFetch(ctx, rest, getenv, stdout, stderr)
	case "dlq":
		return cmdDLQ(ctx, rest, getenv, stdout, stderr)
	case "reparse":
		return cmdReparse(ctx, rest, getenv, stdout, stderr)
	case "export":
		return cmdExport(ctx, rest, getenv, stdout, stderr)
	case "db-url":
		return cmdDBURL(rest, getenv, stdout, stderr)
	case "sentiment":
		return cmdSentiment(ctx, rest, getenv, os.Stdin, stdout, stderr)
	case "notify":
		return cmdNotify(ctx, rest, getenv, stdout, stderr)
	case "rollup":
		return cmdRollup(ctx, rest, getenv, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "playwatch", version)
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usageText)
		fmt.Fprintln(stdout)
		fmt.Fprintln(stdout, "Environment variables (a flag of the same name overrides each, e.g. --http-addr):")
		printSettings(stdout, settings)
		return nil
	default:
		return helpError{usageError{fmt.Sprintf("unknown command %q", cmd)}, usageText}
	}
}

// commandLine is a parsed command line: its config, its logger and the
// arguments after the flags.
type commandLine struct {
	cfg    Config
	logger *slog.Logger
	args   []string
}

// parseCommandLine parses a command's flags (its own, registered by
// addFlags, plus one per config variable) and loads the config.
// errHelp means --help was asked for and its usage printed on stdout; a
// wrong flag prints the usage on stderr.
func parseCommandLine(name, synopsis string, args []string, getenv func(string) string, stdout, stderr io.Writer, addFlags func(*flag.FlagSet)) (commandLine, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if addFlags != nil {
		addFlags(fs)
	}
	own := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { own[f.Name] = true })
	cf := bindConfigFlags(fs)
	var usage bytes.Buffer
	fs.Usage = func() {
		fmt.Fprintf(&usage, "Usage: playwatch %s\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			if own[f.Name] {
				fmt.Fprintf(&usage, "  --%s\t%s%s\n", f.Name, f.Usage, flagDefault(f))
			}
		})
		fmt.Fprintln(&usage)
		fmt.Fprintln(&usage, "Environment variables it reads (a flag of the same name overrides each; 'playwatch --help' lists all):")
		printSettings(&usage, commandSettingList(name))
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = usage.WriteTo(stdout)
			return commandLine{}, errHelp
		}
		_, _ = usage.WriteTo(stderr)
		return commandLine{}, usageError{err.Error()}
	}
	cfg, err := loadConfig(getenv, fs, cf)
	if err != nil {
		return commandLine{}, usageError{err.Error()}
	}
	return commandLine{cfg: cfg, logger: newLogger(cfg, stderr), args: fs.Args()}, nil
}

var errHelp = errors.New("help shown")

// flagDefault is the " (default …)" of a flag's usage line: nothing for a
// zero default, a string quoted, a boolean or a number as it is.
func flagDefault(f *flag.Flag) string {
	switch v := f.DefValue; {
	case v == "" || v == "0" || v == "false":
		return ""
	case isBoolFlag(f.Value):
		return " (default " + v + ")"
	default:
		if _, err := strconv.ParseFloat(v, 64); err == nil {
			return " (default " + v + ")"
		}
		return fmt.Sprintf(" (default %q)", v)
	}
}

func isBoolFlag(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(redactingHandler{h, cfg})
}
