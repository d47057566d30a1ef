package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
