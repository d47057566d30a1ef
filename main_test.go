package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the program's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRun runs `playwatch run` in-process and waits for /readyz.
func startRun(t *testing.T, env map[string]string, args ...string) (base string, stop func() error, logs *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs = &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"run"}, args...), envFunc(env), io.Discard, logs) }()
	base = "http://" + env["PLAYWATCH_HTTP_ADDR"]
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("run exited during start-up: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("not ready after 90s:\n%s", logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(60 * time.Second):
				runErr = errors.New("run did not return 60s after cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() { stop() })
	return base, stop, logs
}

// The appliance on its embedded defaults: managed Postgres, embedded broker,
// registry; it stops cleanly and keeps its data for the next start.
func TestRunAppliance(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"PLAYWATCH_DATA_DIR":    filepath.Join(tempDataDir(t), "data"),
		"PLAYWATCH_HTTP_ADDR":   freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
	}
	base, stop, logs := startRun(t, env)
	if code, body := httpDo(t, "POST", base+"/api/v1/apps", `{"package_name":"org.telegram.messenger","is_messaging_app":true}`); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := httpDo(t, "GET", base+"/metrics", ""); code != 200 || !strings.Contains(body, `playwatch_http_requests_total{code="201",route="POST /api/v1/apps"} 1`) {
		t.Fatalf("metrics: %d\n%s", code, body)
	}
	// A second appliance on the same data directory would take its servers
	// over; a one-off command uses them instead.
	runEnv := map[string]string{}
	for k, v := range env {
		runEnv[k] = v
	}
	runEnv["PLAYWATCH_HTTP_ADDR"] = freeAddr(t)
	if err := run(context.Background(), []string{"run"}, envFunc(runEnv), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a second run on the data directory: %v, want a refusal", err)
	}
	if err := run(context.Background(), []string{"migrate"}, envFunc(env), io.Discard, io.Discard); err != nil {
		t.Fatalf("migrate beside a running appliance: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("run returned %v after cancel\n%s", err, logs)
	}
	for _, want := range []string{"managed postgres ready", "embedded broker listening", "created topic", "playwatch ready", "managed postgres stopped", "playwatch stopped"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q", want)
		}
	}
	if _, err := net.Dial("tcp", env["PLAYWATCH_HTTP_ADDR"]); err == nil {
		t.Error("the HTTP port still accepts connections after shutdown")
	}

	base, stop, logs = startRun(t, env, "--roles", "registry")
	if code, body := httpDo(t, "GET", base+"/api/v1/apps/org.telegram.messenger", ""); code != 200 {
		t.Fatalf("after restart: %d %s\n%s", code, body, logs)
	}
	if strings.Contains(logs.String(), "created topic") {
		t.Error("topics were created again on restart")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestRunCommandLine(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, envFunc(nil), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, s := range settings {
		if !strings.Contains(out.String(), s.env) {
			t.Errorf("--help does not list %s", s.env)
		}
	}
	// Every command's --help is its usage on stdout, and no error.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--help"}, "--roles\tcomma-separated roles"},
		{[]string{"crawl", "-h"}, "--once\tplan one cycle now, crawl it, print its summary and exit; refused while another playwatch leads (default: the crawler role of run: the scheduler and the crawl workers)\n"},
		{[]string{"fetch", "--help"}, "--reviews\tnewest reviews to read; default REVIEWS_PER_APP\n"},
		{[]string{"migrate", "--help"}, "Usage: playwatch migrate"},
		{[]string{"pcap", "--help"}, "--dry-run\tprint the messages as JSON lines instead of publishing them\n"},
		{[]string{"dlq", "--help"}, "playwatch dlq replay"},
		{[]string{"dlq", "list", "--help"}, "Usage: playwatch dlq list"},
		{[]string{"dlq", "replay", "--help"}, "Usage: playwatch dlq replay"},
		{[]string{"sentiment", "--help"}, "  rescore --all|--model-older"},
		{[]string{"sentiment", "run", "--help"}, "Usage: playwatch sentiment run"},
		{[]string{"sentiment", "rescore", "--help"}, "--model-older\tmark the reviews another model version scored\n"},
		{[]string{"notify", "run", "--help"}, "Usage: playwatch notify run"},
	} {
		out.Reset()
		errOut.Reset()
		if err := run(context.Background(), c.args, envFunc(nil), &out, &errOut); err != nil {
			t.Errorf("%q: %v", c.args, err)
		}
		if !strings.Contains(out.String(), c.want) || errOut.Len() > 0 {
			t.Errorf("%q: stdout has no %q, or stderr is not empty:\nstdout:\n%s\nstderr:\n%s", c.args, c.want, out.String(), errOut.String())
		}
	}
	errOut.Reset()
	if err := run(context.Background(), []string{"run", "--no-such-flag"}, envFunc(nil), &out, &errOut); err == nil || !strings.Contains(errOut.String(), "Usage: playwatch run") {
		t.Errorf("a wrong flag: err %v, usage on stderr:\n%s", err, errOut.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"version"}, envFunc(nil), &out, &errOut); err != nil || !strings.Contains(out.String(), "playwatch") {
		t.Errorf("version: %v %q", err, out.String())
	}

	var uerr usageError
	for _, args := range [][]string{nil, {"frobnicate"}, {"run", "--roles", "registry,chef"}, {"run", "extra"}, {"run", "--no-such-flag"},
		{"sentiment"}, {"sentiment", "classify-all"}, {"sentiment", "run", "extra"}} {
		if err := run(context.Background(), args, envFunc(nil), io.Discard, io.Discard); !errors.As(err, &uerr) {
			t.Errorf("%q: err = %v, want a usage error", args, err)
		}
	}
	err := run(context.Background(), []string{"run"}, envFunc(map[string]string{"CRAWL_NOTHING": "x", "KAFKA_TOPIC_PARTITIONS": "-3"}), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "KAFKA_TOPIC_PARTITIONS") {
		t.Errorf("invalid env: %v", err)
	}
}

// The README's configuration table names every variable.
func TestReadmeListsEverySetting(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range settings {
		if !strings.Contains(string(b), "`"+s.env+"`") {
			t.Errorf("README.md does not document %s", s.env)
		}
	}
}

// Every setting is in one group of settingGroups, and what a command
// declares it reads names groups or settings that exist.
func TestSettingGroups(t *testing.T) {
	known := map[string]bool{}
	for _, s := range settings {
		known[s.env] = true
	}
	in := map[string]string{}
	for g, envs := range settingGroups {
		for _, env := range envs {
			if !known[env] {
				t.Errorf("settingGroups[%q] names %s, which is no setting", g, env)
			}
			if other, ok := in[env]; ok {
				t.Errorf("%s is in the groups %q and %q", env, other, g)
			}
			in[env] = g
		}
	}
	for _, s := range settings {
		if _, ok := in[s.env]; !ok {
			t.Errorf("%s is in no group of settingGroups (config.go): add it to the group of the part that reads it", s.env)
		}
	}
	for cmd, reads := range commandSettings {
		for _, r := range reads {
			if _, ok := settingGroups[r]; !ok && !known[r] {
				t.Errorf("commandSettings[%q] names %q, neither a group nor a setting", cmd, r)
			}
		}
	}
}

// A command's --help lists its flags and the variables it reads, no
// others; `playwatch --help` lists them all.
func TestCommandHelpListsTheSettingsItReads(t *testing.T) {
	listed := func(help string) []string {
		var envs []string
		for _, line := range strings.Split(help, "\n") {
			if f := strings.Fields(line); strings.HasPrefix(line, "  ") && len(f) > 0 && f[0] == strings.ToUpper(f[0]) && !strings.HasPrefix(f[0], "-") {
				envs = append(envs, f[0])
			}
		}
		return envs
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--help"}, envFunc(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := listed(out.String()); len(got) != len(settings) {
		t.Errorf("playwatch --help lists %d variables, want all %d", len(got), len(settings))
	}
	for cmd := range commandSettings {
		out.Reset()
		if err := run(context.Background(), append(strings.Fields(cmd), "--help"), envFunc(nil), &out, io.Discard); err != nil {
			t.Fatalf("%s --help: %v", cmd, err)
		}
		var want []string
		for _, s := range commandSettingList(cmd) {
			want = append(want, s.env)
		}
		if got := listed(out.String()); strings.Join(got, " ") != strings.Join(want, " ") || cmd != "run" && len(got) >= len(settings) {
			t.Errorf("%s --help lists %v, want %v:\n%s", cmd, got, want, out.String())
		}
	}
	for _, c := range []struct {
		cmd       []string
		has, lack []string
	}{
		{[]string{"fetch"}, []string{"--max-wait", "PLAYSTORE_URL", "PROXIES", "REVIEWS_PER_APP"}, []string{"DATABASE_URL", "KAFKA_BROKERS", "CRAWL_INTERVAL"}},
		{[]string{"migrate"}, []string{"DATABASE_URL", "PLAYWATCH_DATA_DIR"}, []string{"KAFKA_BROKERS", "PROXIES", "SENTIMENT_BATCH"}},
		{[]string{"db-url"}, []string{"--reader", "PLAYWATCH_DATA_DIR"}, []string{"LOG_LEVEL", "KAFKA_BROKERS"}},
		{[]string{"dlq", "replay"}, []string{"--all", "CONSUMER_MAX_RECORD_BYTES"}, []string{"CONSUMER_LINGER", "KAFKA_BROKERS"}},
		{[]string{"run"}, []string{"--roles", "PLAYWATCH_HTTP_ADDR", "SENTIMENT_BATCH", "KAFKA_SASL_PASSWORD"}, nil},
	} {
		out.Reset()
		if err := run(context.Background(), append(c.cmd, "--help"), envFunc(nil), &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		for _, s := range c.has {
			if !strings.Contains(out.String(), "  "+s) {
				t.Errorf("%s --help lacks %s", c.cmd, s)
			}
		}
		for _, s := range c.lack {
			if strings.Contains(out.String(), s) {
				t.Errorf("%s --help lists %s, which it does not read", c.cmd, s)
			}
		}
	}
}

// An unknown command: its error comes first, then the help; exit status 2.
func TestUnknownCommandErrorFirst(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, nil} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, envFunc(nil), &out, &errOut)
		if out.Len() > 0 || errOut.Len() > 0 {
			t.Errorf("%q printed before its error:\nstdout: %s\nstderr: %s", args, out.String(), errOut.String())
		}
		var shown bytes.Buffer
		if code := exitStatus(err, &shown); code != 2 {
			t.Errorf("%q: exit status %d, want 2", args, code)
		}
		first, rest, _ := strings.Cut(shown.String(), "\n")
		want := `playwatch: unknown command "frobnicate"`
		if args == nil {
			want = "playwatch: no command given"
		}
		if first != want || !strings.Contains(rest, "Usage:") || !strings.Contains(rest, "playwatch db-url") {
			t.Errorf("%q shows:\n%s", args, shown.String())
		}
	}
	var shown bytes.Buffer
	if code := exitStatus(errors.New("broken"), &shown); code != 1 || shown.String() != "playwatch: broken\n" {
		t.Errorf("another error: status %d, %q", code, shown.String())
	}
	if code := exitStatus(nil, &shown); code != 0 {
		t.Errorf("no error: status %d", code)
	}
}

// migrate says the schema version and what it applied, also when there is
// nothing to apply.
func TestMigratePrintsTheSchemaVersion(t *testing.T) {
	ms, err := parseMigrations(schemaSQL)
	if err != nil {
		t.Fatal(err)
	}
	if err := testPG.start(); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("pwt_%d_empty_%d", os.Getpid(), testPG.seq.Add(1))
	if err := testPG.exec(context.Background(), "CREATE DATABASE "+name+testPG.owner); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testPG.exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)") })
	var all []string
	for _, m := range ms {
		all = append(all, strconv.Itoa(m.Version))
	}
	env := map[string]string{"DATABASE_URL": testPG.urlFor(name), "PLAYWATCH_DATA_DIR": t.TempDir(), "LOG_LEVEL": "warn"}
	for _, want := range []string{
		fmt.Sprintf("schema at version %d; applied %s\n", len(ms), strings.Join(all, ", ")),
		fmt.Sprintf("schema at version %d; nothing to apply\n", len(ms)),
	} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"migrate"}, envFunc(env), &out, &errOut); err != nil {
			t.Fatalf("migrate: %v\n%s", err, errOut.String())
		}
		if out.String() != want {
			t.Errorf("migrate printed %q, want %q", out.String(), want)
		}
	}
}

// db-url, like every command that attaches, refuses a data directory on
// which no playwatch runs: its URL would name a cluster that is not there.
func TestDBURLNeedsARunningPlaywatch(t *testing.T) {
	dir := filepath.Join(tempDataDir(t), "data")
	// What a playwatch that ran once leaves: a cluster's passwords.
	if err := os.MkdirAll(filepath.Join(dir, "postgres"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := loadPasswords(pgPassFile(filepath.Join(dir, "postgres")), managedDatabase); err != nil {
		t.Fatal(err)
	}
	for _, env := range []map[string]string{
		{"PLAYWATCH_DATA_DIR": dir},
		{"PLAYWATCH_DATA_DIR": dir, "PLAYWATCH_PG_LISTEN": "127.0.0.1:5433"},
	} {
		for _, args := range [][]string{{"db-url"}, {"db-url", "--reader"}} {
			var out, errOut bytes.Buffer
			err := run(context.Background(), args, envFunc(env), &out, &errOut)
			if !errors.Is(err, errNotRunning) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "playwatch run") || out.Len() > 0 {
				t.Errorf("%q with %v and no playwatch running: %v, printed %q", args, env, err, out.String())
			}
		}
	}
	env := map[string]string{"PLAYWATCH_DATA_DIR": dir, "DATABASE_URL": "postgres://u@db.example/playwatch"}
	if err := run(context.Background(), []string{"db-url"}, envFunc(env), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "DATABASE_URL is set") {
		t.Errorf("db-url with DATABASE_URL: %v", err)
	}
}
