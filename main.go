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
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
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
  playwatch export reviews|stats [--package P] [--country C] [--lang L] [--q Q] [--stars S] [--sentiment L] [--since D] [--until T] [--format csv|ndjson|json] [--output FILE]
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

// commandFunc is the body of a command (or of a subcommand): it gets the
// arguments after its name.
type commandFunc func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error

// commands are playwatch's commands by name; version and help are
// runCommand's own.
var commands = map[string]commandFunc{
	"run":     cmdRun,
	"migrate": cmdMigrate,
	"pcap":    cmdPcap,
	"crawl":   cmdCrawl,
	"fetch":   cmdFetch,
	"dlq":     cmdDLQ,
	"reparse": cmdReparse,
	"export":  cmdExport,
	"db-url":  cmdDBURL,
	"sentiment": func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
		return cmdSentiment(ctx, args, getenv, os.Stdin, stdout, stderr)
	},
	"notify": cmdNotify,
	"rollup": cmdRollup,
}

func runCommand(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return helpError{usageError{"no command given"}, usageText}
	}
	cmd := args[0]
	if run, ok := commands[cmd]; ok {
		return run(ctx, args[1:], getenv, stdout, stderr)
	}
	switch {
	case cmd == "version":
		fmt.Fprintln(stdout, "playwatch", version)
		return nil
	case isHelpArg(cmd):
		fmt.Fprint(stdout, usageText)
		fmt.Fprintln(stdout)
		fmt.Fprintln(stdout, "Environment variables (a flag of the same name overrides each, e.g. --http-addr):")
		printSettings(stdout, settings)
		return nil
	}
	return helpError{usageError{fmt.Sprintf("unknown command %q", cmd)}, usageText}
}

// commandGroup is a command whose first argument names a subcommand, as
// in `playwatch notify list`.
type commandGroup struct {
	usage string // on stdout for help, on stderr before a usage error
	subs  map[string]commandFunc
	// missing is the usage error when no subcommand is given; unknown
	// formats (%q) the name of one it does not know ("": missing).
	missing, unknown string
}

func (g commandGroup) run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 && isHelpArg(args[0]) {
		fmt.Fprint(stdout, g.usage)
		return errHelp
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, g.usage)
		return usageError{g.missing}
	}
	sub, ok := g.subs[args[0]]
	if !ok {
		fmt.Fprint(stderr, g.usage)
		if g.unknown == "" {
			return usageError{g.missing}
		}
		return usageError{fmt.Sprintf(g.unknown, args[0])}
	}
	return sub(ctx, args[1:], getenv, stdout, stderr)
}

// usageOf is the usage text of a command with these synopses.
func usageOf(synopses ...string) string {
	var b strings.Builder
	b.WriteString("Usage:\n")
	for _, s := range synopses {
		b.WriteString("  playwatch " + s + "\n")
	}
	return b.String()
}

// subcommandsOf are the subs of a commandGroup whose subcommands one
// function serves, told which one runs.
func subcommandsOf(names []string, run func(ctx context.Context, sub string, args []string, getenv func(string) string, stdout, stderr io.Writer) error) map[string]commandFunc {
	subs := map[string]commandFunc{}
	for _, sub := range names {
		subs[sub] = func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
			return run(ctx, sub, args, getenv, stdout, stderr)
		}
	}
	return subs
}

// isHelpArg: the argument asks for help.
func isHelpArg(a string) bool {
	return slices.Contains([]string{"help", "-h", "-help", "--help"}, a)
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

// parseNoArgs is parseCommandLine for a command that takes no arguments.
func parseNoArgs(name, synopsis string, args []string, getenv func(string) string, stdout, stderr io.Writer, addFlags func(*flag.FlagSet)) (commandLine, error) {
	cl, err := parseCommandLine(name, synopsis, args, getenv, stdout, stderr, addFlags)
	if err == nil && len(cl.args) > 0 {
		err = usageError{fmt.Sprintf("%s takes no arguments, got %q", name, cl.args)}
	}
	return cl, err
}

// attach runs fn on the backends of the playwatch that runs on the data
// directory (or of DATABASE_URL and KAFKA_BROKERS), as one-off commands
// do, and shuts them down after it, whatever it returned.
func (cl commandLine) attach(ctx context.Context, opts backendOptions, fn func(*backends) error) (err error) {
	opts.attach = true
	be, err := openBackends(ctx, cl.cfg, cl.logger, opts)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, be.shutdown(ctx, cl.cfg.ShutdownTimeout)) }()
	return fn(be)
}

// publisher is a one-off command's publisher to the broker of be: its
// producer is flushed at shutdown, and it waits while the embedded
// broker's budget is full, as the crawler's does.
func (cl commandLine) publisher(be *backends) (*publisher, error) {
	producer, err := newProducer(cl.cfg, be.brokers)
	if err != nil {
		return nil, err
	}
	be.onClose(flushAndClose(producer))
	pub := newPublisher(producer, cl.cfg.Producer, prometheus.NewRegistry(), cl.logger)
	pub.gate = be.publishGate()
	return pub, nil
}

// parseIDs reads a command's arguments as the ids of what it acts on
// (noun, e.g. "dead letter"): positive integers.
func parseIDs(command, noun string, args []string) ([]int64, error) {
	var ids []int64
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id < 1 {
			return nil, usageError{fmt.Sprintf("%s: %q is not a %s id", command, a, noun)}
		}
		ids = append(ids, id)
	}
	return ids, nil
}

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
