package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A lock file that cannot be opened is an error that names its path once.
func TestLockDataDirErrorNamesThePathOnce(t *testing.T) {
	dir := t.TempDir()
	lock := filepath.Join(dir, "playwatch.lock")
	if err := os.Mkdir(lock, 0o755); err != nil { // a directory cannot be opened for writing
		t.Fatal(err)
	}
	_, err := lockDataDir(dir)
	if err == nil {
		t.Fatal("lockDataDir succeeded on a directory")
	}
	if n := strings.Count(err.Error(), lock); n != 1 {
		t.Errorf("error %q names %s %d times, want once", err, lock, n)
	}
}

// attachTestAppliance is one of two appliances of the attach tests, with a
// pool on its database reached the way a user would: its socket.
type attachTestAppliance struct {
	dir, brokerAddr, pkg string
	base, pgListen       string
	pool                 *pgxpool.Pool
}

func startAttachTestAppliance(t *testing.T, pkg, pgListen string) *attachTestAppliance {
	t.Helper()
	a := &attachTestAppliance{dir: filepath.Join(tempDataDir(t), "data"), brokerAddr: freeAddr(t), pkg: pkg, pgListen: pgListen}
	env := map[string]string{"PLAYWATCH_DATA_DIR": a.dir, "PLAYWATCH_HTTP_ADDR": freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": a.brokerAddr, "PLAYWATCH_PG_LISTEN": pgListen, "CONSUMER_LINGER": "0s", "LOG_LEVEL": "warn"}
	a.base, _, _ = startRun(t, env, "--roles", "registry,consumer")
	if code, body := httpDo(t, http.MethodPost, a.base+"/api/v1/apps", `{"package_name":"`+pkg+`"}`); code != http.StatusCreated {
		t.Fatalf("register %s: %d %s", pkg, code, body)
	}
	port := pgListenPort(pgListen)
	a.pool = newTestPoolFor(t, managedPostgresDSN(postgresSocketDir(filepath.Join(a.dir, "postgres"), port), port, managedDatabase))
	return a
}

// Two appliances at once, on two data directories with their own broker
// ports, one with its PostgreSQL also on TCP: every one-off command run on a
// data directory works with that directory's appliance, whatever the
// caller's own PLAYWATCH_BROKER_ADDR and PLAYWATCH_PG_LISTEN say (here: the
// other appliance's broker, and no TCP port).
func TestOneOffCommandsAttachToTheApplianceOfTheirDataDir(t *testing.T) {
	t.Parallel()
	replay := newReplayPlayStore(t)
	a := startAttachTestAppliance(t, "com.example.alpha", "")
	b := startAttachTestAppliance(t, "com.example.beta", freeAddr(t))
	command := func(on, other *attachTestAppliance, args ...string) (string, error) {
		t.Helper()
		env := map[string]string{"PLAYWATCH_DATA_DIR": on.dir, "PLAYWATCH_BROKER_ADDR": other.brokerAddr,
			"PLAYSTORE_URL": replay.URL, "RATE_LIMIT_REQUESTS": "0", "EGRESS_MIN_GAP": "0s", "REVIEWS_PER_APP": "5", "LOG_LEVEL": "warn"}
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, envFunc(env), &out, &errOut)
		if err != nil {
			err = fmt.Errorf("playwatch %s on %s: %w\n%s", strings.Join(args, " "), on.dir, err, errOut.String())
		}
		return out.String(), err
	}
	for _, p := range [][2]*attachTestAppliance{{a, b}, {b, a}} {
		on, other := p[0], p[1]
		replay.setApp(on.pkg, replayApp{Reviews: 5})
		// A migration version from the future in this database only: migrate
		// refuses it here, and only here.
		if _, err := on.pool.Exec(context.Background(), `INSERT INTO storage_consumer_migrations (version, name) VALUES (1000, 'future')`); err != nil {
			t.Fatal(err)
		}
		if _, err := command(on, other, "migrate"); err == nil || !strings.Contains(err.Error(), "at migration 1000") {
			t.Errorf("migrate on a database at migration 1000: %v", err)
		}
		if _, err := command(other, on, "migrate"); err != nil {
			t.Error(err)
		}
		if _, err := on.pool.Exec(context.Background(), `DELETE FROM storage_consumer_migrations WHERE version = 1000`); err != nil {
			t.Fatal(err)
		}
		if _, err := command(on, other, "migrate"); err != nil {
			t.Error(err)
		}
		if out, err := command(on, other, "pcap", "--app", on.pkg, "--scenario", "UPLOAD", "testdata/pcap/clean_upload.pcap"); err != nil {
			t.Error(err)
		} else if !strings.Contains(out, "published analysis") {
			t.Errorf("pcap printed %q", out)
		}
		// db-url names the TCP address the appliance listens on, or none.
		if out, err := command(on, other, "db-url", "--reader"); err != nil {
			t.Error(err)
		} else if on.pgListen != "" && !strings.Contains(out, "@"+on.pgListen+"/") || on.pgListen == "" && !strings.Contains(out, "host=%2F") {
			t.Errorf("db-url on %s (listening on %q) printed %q", on.dir, on.pgListen, out)
		}
		if out, err := command(on, other, "crawl", "--once"); err != nil {
			t.Error(err)
		} else if !strings.HasPrefix(out, "app_stats: 1/1, reviews: 1/1 (5 review messages)") {
			t.Errorf("crawl --once printed %q", out)
		}
	}
	for _, x := range []*attachTestAppliance{a, b} {
		waitFor(t, 30*time.Second, x.pkg+"'s analysis, stats and reviews in its own appliance", func() bool {
			return count(t, x.pool, `SELECT count(*) FROM network_metrics`) == 1 && count(t, x.pool, `SELECT count(*) FROM app_stats`) == 1 &&
				count(t, x.pool, `SELECT count(*) FROM reviews`) == 5
		})
		if n := count(t, x.pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
			t.Errorf("%d dead letters in %s's appliance: a command of the other one published there", n, x.pkg)
		}
	}

	// A dead letter in A only: dlq lists it on A's data directory and not on
	// B's, whose database a caller without PLAYWATCH_PG_LISTEN reaches too.
	produce(t, []string{a.brokerAddr}, rec(topicReviews, "com.example.nobody", msgJSON(reviewFields("com.example.nobody", "r1", testCrawl))))
	waitFor(t, 30*time.Second, "the dead letter in A", func() bool { return count(t, a.pool, `SELECT count(*) FROM dead_letter_events`) == 1 })
	for _, c := range []struct {
		on, other *attachTestAppliance
		want      string
	}{{a, b, "com.example.nobody is not registered"}, {b, a, "0 dead letters"}} {
		if out, err := command(c.on, c.other, "dlq", "list"); err != nil || !strings.Contains(out, c.want) {
			t.Errorf("dlq list on %s: %v\n%s", c.on.dir, err, out)
		}
		if out, err := command(c.on, c.other, "dlq", "replay", "--all"); err != nil || !strings.HasPrefix(out, "stored 0") {
			t.Errorf("dlq replay --all on %s: %v\n%s", c.on.dir, err, out)
		}
	}
}

// What a playwatch that is gone left in its data directory is not used,
// even when the services it names answer; nor is what another pid wrote
// while the lock's holder has not published yet. What the holder publishes
// is used, and another version than the command's is warned about.
func TestStaleAttachFileIsIgnored(t *testing.T) {
	t.Parallel()
	dbURL := newTestDatabase(t)
	_, brokers := newTestBroker(t, t.TempDir())
	dir := tempDataDir(t)
	release, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale := runningPlaywatch{PID: gone.Process.Pid, Version: version, DatabaseURL: dbURL, Brokers: brokers}
	if _, err := publishRunning(dir, stale); err != nil {
		t.Fatal(err)
	}
	release() // its playwatch died
	env := map[string]string{"PLAYWATCH_DATA_DIR": dir, "PLAYWATCH_BROKER_ADDR": freeAddr(t), "LOG_LEVEL": "warn"}
	want := fmt.Sprintf("left from pid %d, which is gone", stale.PID)
	for _, args := range [][]string{{"dlq", "list"}, {"pcap", "--app", "com.example.a", "--scenario", "UPLOAD", "testdata/pcap/clean_upload.pcap"}} {
		if err := run(context.Background(), args, envFunc(env), io.Discard, io.Discard); !errors.Is(err, errNotRunning) || !strings.Contains(err.Error(), want) {
			t.Errorf("%q beside a stale attach file: %v", args, err)
		}
	}

	// A new playwatch holds the lock but is still starting: the file of the
	// old one is not its.
	release, err = lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := publishRunning(dir, stale); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"dlq", "list"}, envFunc(env), io.Discard, io.Discard); err == nil || !strings.Contains(err.Error(), "has not published its services yet") {
		t.Errorf("dlq list while the lock's holder starts: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
		t.Error("a command created a cluster in the data directory")
	}

	// Once the holder publishes, the command attaches, and warns that the
	// holder is another version.
	if _, err := publishRunning(dir, runningPlaywatch{PID: os.Getpid(), Version: "v0.0.1-other", DatabaseURL: dbURL, Brokers: brokers}); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"dlq", "list"}, envFunc(env), &out, &errOut); err != nil || !strings.Contains(out.String(), "0 dead letters") {
		t.Errorf("dlq list once the holder published: %v\n%s", err, out.String())
	}
	if !strings.Contains(errOut.String(), "another version") || !strings.Contains(errOut.String(), "its_version=v0.0.1-other") {
		t.Errorf("no warning about the other version:\n%s", errOut.String())
	}

	// The embedded broker's budget, retention and consumer group are the
	// running playwatch's: the command guards what that consumer has not
	// stored, with that budget.
	running := runningPlaywatch{PID: os.Getpid(), Version: version, DatabaseURL: dbURL, Brokers: brokers,
		EmbeddedBroker: true, BrokerMaxBytes: 64 << 20, TopicRetention: 3 * time.Hour, ConsumerGroup: "group-of-run"}
	if _, err := publishRunning(dir, running); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadTestConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	got, _, err := attachedConfig(cfg)
	if err != nil || got.BrokerMaxBytes != running.BrokerMaxBytes || got.topicRetention(true) != running.TopicRetention || got.ConsumerGroup != running.ConsumerGroup {
		t.Errorf("attached: %v, budget %d, retention %s, group %q; want the running playwatch's", err, got.BrokerMaxBytes, got.topicRetention(true), got.ConsumerGroup)
	}
}

// A one-off command on a data directory where no playwatch runs fails, says
// how to point it at one, and creates nothing there; migrate with
// DATABASE_URL needs no running playwatch.
func TestOneOffCommandsNeedARunningPlaywatch(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(tempDataDir(t), "data")
	env := map[string]string{"PLAYWATCH_DATA_DIR": dir, "PLAYWATCH_BROKER_ADDR": freeAddr(t), "LOG_LEVEL": "warn"}
	for _, c := range []struct {
		args []string
		set  string
	}{
		{[]string{"pcap", "--app", "com.example.a", "--scenario", "UPLOAD", "testdata/pcap/clean_upload.pcap"}, "set DATABASE_URL and KAFKA_BROKERS"},
		{[]string{"crawl", "--once"}, "set DATABASE_URL and KAFKA_BROKERS"},
		{[]string{"dlq", "list"}, "set DATABASE_URL"},
		{[]string{"dlq", "replay", "--all"}, "set DATABASE_URL"},
		{[]string{"migrate"}, "set DATABASE_URL"},
	} {
		err := run(context.Background(), c.args, envFunc(env), io.Discard, io.Discard)
		if !errors.Is(err, errNotRunning) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "PLAYWATCH_DATA_DIR") ||
			!strings.HasSuffix(err.Error(), c.set) {
			t.Errorf("%q with no playwatch running: %v", c.args, err)
		}
	}
	// With the database named, only the broker is missing.
	env["DATABASE_URL"] = newTestDatabase(t)
	pcap := []string{"pcap", "--app", "com.example.a", "--scenario", "UPLOAD", "testdata/pcap/clean_upload.pcap"}
	if err := run(context.Background(), pcap, envFunc(env), io.Discard, io.Discard); !errors.Is(err, errNotRunning) || !strings.HasSuffix(err.Error(), "set KAFKA_BROKERS") {
		t.Errorf("pcap with DATABASE_URL only: %v", err)
	}
	if err := run(context.Background(), []string{"migrate"}, envFunc(env), io.Discard, io.Discard); err != nil {
		t.Errorf("migrate with DATABASE_URL: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the data directory was created: %v", err)
	}
}

// The attach file is readable by other users: no password goes in it.
func TestAttachFileHoldsNoPassword(t *testing.T) {
	dir := t.TempDir()
	if _, err := publishRunning(dir, runningPlaywatch{PID: 1, Version: version, Brokers: []string{"127.0.0.1:9092"},
		DatabaseURL: "postgres://pw:s3cret@db.example:5432/playwatch?sslmode=require&password=s3cret2&sslpassword=s3cret3"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, attachFileName))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "s3cret") || !strings.Contains(string(b), `"postgres://pw@db.example:5432/playwatch?sslmode=require"`) {
		t.Errorf("attach file:\n%s", b)
	}
}
