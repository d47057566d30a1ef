package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func queryInt(t *testing.T, dsn, sql string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// startTestManagedPostgres starts the managed cluster of opts and stops it
// when t ends.
func startTestManagedPostgres(t testing.TB, opts managedPostgresOptions, logger *slog.Logger) *managedPostgres {
	t.Helper()
	pg, err := startManagedPostgres(context.Background(), opts, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop(context.Background()) })
	return pg
}

// The managed cluster keeps its data across restarts and recovers from what
// a crash leaves: a server still running on the directory, or a stale
// postmaster.pid naming some other process.
func TestManagedPostgresRestartAndCrashLeftovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := managedPostgresOptions{DataDir: filepath.Join(tempDataDir(t), "pg"), Database: "playwatch", OSUser: "postgres", NoFsync: true}
	logger := testLogger(t)

	first := startTestManagedPostgres(t, opts, logger)
	conn, err := pgx.Connect(ctx, first.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1), (2)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)

	// A second start while the first server still runs: as after playwatch
	// was SIGKILLed and its server survived. It takes the directory over.
	second, err := startManagedPostgres(ctx, opts, logger)
	if err != nil {
		t.Fatalf("start over a running server: %v", err)
	}
	select {
	case <-first.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the earlier server still runs")
	}
	if n := queryInt(t, second.DSN(), "SELECT count(*) FROM kept"); n != 2 {
		t.Fatalf("kept has %d rows after the takeover, want 2", n)
	}
	if err := second.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// A stale pid file naming a live process that is not postgres (this test).
	pidFile := filepath.Join(opts.DataDir, "postmaster.pid")
	stale := fmt.Sprintf("%d\n%s\n1700000000\n5432\n", os.Getpid(), opts.DataDir)
	if err := os.WriteFile(pidFile, []byte(stale), 0o600); err != nil {
		t.Fatal(err)
	}
	third, err := startManagedPostgres(ctx, opts, logger)
	if err != nil {
		t.Fatalf("start with a stale postmaster.pid: %v", err)
	}
	defer third.Stop(ctx)
	if n := queryInt(t, third.DSN(), "SELECT count(*) FROM kept"); n != 2 {
		t.Fatalf("kept has %d rows after restart, want 2", n)
	}
}

func TestManagedPostgresRefusesForeignDirectory(t *testing.T) {
	dir := filepath.Join(tempDataDir(t), "pg")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "important.txt"), []byte("not a cluster"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := startManagedPostgres(context.Background(), managedPostgresOptions{DataDir: dir, Database: "playwatch", OSUser: "postgres"}, testLogger(t))
	if err == nil || !strings.Contains(err.Error(), "PG_VERSION") {
		t.Fatalf("err = %v, want a refusal to initdb over foreign files", err)
	}
}

func TestPostgresSocketDirStaysShort(t *testing.T) {
	long := "/tmp/" + strings.Repeat("deep/", 30) + "postgres"
	if d := postgresSocketDir(long, 5432); len(d)+len("/.s.PGSQL.5432") >= 100 {
		t.Fatalf("socket dir %q is too long for a unix socket", d)
	}
	if d := postgresSocketDir("/srv/pw/postgres", 5432); d != "/srv/pw/postgres-socket" {
		t.Fatalf("short data dir: socket dir %q, want it beside the data dir", d)
	}
}

// A first start interrupted during initdb, once initdb has begun writing
// the cluster, leaves no half-made cluster: the next start initialises the
// directory and runs.
func TestManagedPostgresInterruptedInitdb(t *testing.T) {
	t.Parallel()
	opts := managedPostgresOptions{DataDir: filepath.Join(tempDataDir(t), "pg"), Database: "playwatch", OSUser: "postgres", NoFsync: true}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	interrupted := false
	opts.initdbStarted = func(p *os.Process) {
		// initdb is stopped while the test looks at what it wrote, so it
		// cannot finish between the look and the interrupt, however fast
		// it is: the SIGINT is pending when it runs again.
		for {
			if err := p.Signal(syscall.SIGSTOP); err != nil {
				t.Errorf("stop initdb: %v", err)
				return
			}
			if _, err := os.Stat(filepath.Join(opts.DataDir+"-initdb", "PG_VERSION")); err == nil {
				break
			}
			p.Signal(syscall.SIGCONT)
			time.Sleep(5 * time.Millisecond)
		}
		p.Signal(syscall.SIGINT)
		cancel()
		interrupted = p.Signal(syscall.SIGCONT) == nil
	}
	if pg, err := startManagedPostgres(ctx, opts, testLogger(t)); err == nil {
		pg.Stop(context.Background())
		t.Fatal("the start whose initdb was interrupted succeeded")
	} else if !interrupted {
		t.Fatalf("initdb was not interrupted: %v", err)
	}
	if _, err := os.Stat(filepath.Join(opts.DataDir, "PG_VERSION")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after the interrupted initdb, %s/PG_VERSION: %v; want no cluster", opts.DataDir, err)
	}
	opts.initdbStarted = nil
	pg, err := startManagedPostgres(context.Background(), opts, testLogger(t))
	if err != nil {
		t.Fatalf("start after an interrupted initdb: %v", err)
	}
	defer pg.Stop(context.Background())
	if n := queryInt(t, pg.DSN(), "SELECT 1"); n != 1 {
		t.Fatal(n)
	}
}

// After a kill -9 of playwatch its server gets a fast shutdown (the
// parent-death signal) and deletes its files while the next playwatch,
// started at once, takes the data directory over: every start is ready.
func TestManagedPostgresRestartRightAfterKill(t *testing.T) {
	t.Parallel()
	restartRightAfterKill(t, 3)
}

// restartRightAfterKill runs `playwatch run` and, rounds times, kills it
// with SIGKILL once ready and starts it again at once.
func restartRightAfterKill(t *testing.T, rounds int) {
	bin := buildPlaywatch(t)
	logPath := filepath.Join(t.TempDir(), "playwatch.log")
	env := managedApplianceEnv(t, filepath.Join(tempDataDir(t), "data"), nil)
	a := startAppliance(t, bin, env, logPath, "--roles", "registry")
	for round := 1; round <= rounds; round++ {
		if err := a.stop(t, syscall.SIGKILL, 30*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("round %d: playwatch exited with %v, want killed", round, err)
		}
		killed := time.Now()
		a = startAppliance(t, bin, env, logPath, "--roles", "registry")
		t.Logf("round %d: ready %s after the kill", round, time.Since(killed).Round(time.Millisecond))
	}
	if err := a.stop(t, syscall.SIGTERM, time.Minute); err != nil {
		t.Fatalf("playwatch exited with %v after SIGTERM", err)
	}
}

// A first start killed during initdb, at several points, leaves nothing that
// stops the next start from making the cluster. Killed alone, playwatch
// leaves its initdb running; the next start waits for it to end instead of
// removing its files from under it, and the cluster it makes stays sound.
func TestManagedPostgresKilledDuringInitdb(t *testing.T) {
	t.Parallel()
	bin := buildPlaywatch(t)
	dataDir := filepath.Join(tempDataDir(t), "data")
	tmp := filepath.Join(dataDir, "postgres-initdb")
	var logs syncBuffer
	defer func() {
		if t.Failed() {
			t.Logf("playwatch output:\n%s", logs.String())
		}
	}()
	env := managedApplianceEnv(t, dataDir, nil)
	// start starts `playwatch run` in a process group of its own and returns
	// it once it has started initdb.
	start := func() *exec.Cmd {
		t.Helper()
		fmt.Fprintln(&logs, "==== playwatch run --roles registry")
		cmd := exec.Command(bin, "run", "--roles", "registry")
		cmd.Env = os.Environ()
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		initdb := make(chan struct{})
		cmd.Stderr = &lineWatcher{w: &logs, line: "initialising managed postgres cluster", seen: initdb}
		cmd.SysProcAttr = childProcAttr(true)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-initdb:
		case <-time.After(30 * time.Second):
			t.Fatal("playwatch run did not start initdb")
		}
		return cmd
	}
	for _, after := range []time.Duration{0, 300 * time.Millisecond, 700 * time.Millisecond, 1200 * time.Millisecond, 1800 * time.Millisecond} {
		cmd := start()
		time.Sleep(after)
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		t.Logf("killed playwatch and its initdb %s into initdb", after)
		unmakeFinishedCluster(t, filepath.Join(dataDir, "postgres"))
	}

	// playwatch alone: its initdb goes on.
	cmd := start()
	time.Sleep(500 * time.Millisecond)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	orphans := processesNaming(t, "-D\x00"+tmp+"\x00")
	t.Logf("killed playwatch alone 500ms into initdb; processes of its initdb still running: %v", orphans)

	logPath := filepath.Join(t.TempDir(), "playwatch.log")
	defer func() {
		if b, _ := os.ReadFile(logPath); t.Failed() {
			t.Logf("the starts after the kills:\n%s", b)
		}
	}()
	// An orphan that ended on its own before the next start leaves nothing
	// to wait for.
	orphans = processesNaming(t, "-D\x00"+tmp+"\x00")
	for i := range 2 {
		began := time.Now()
		a := startAppliance(t, bin, env, logPath, "--roles", "registry")
		t.Logf("start %d after the kills: ready in %s", i+1, time.Since(began).Round(time.Millisecond))
		if err := a.stop(t, syscall.SIGTERM, time.Minute); err != nil {
			t.Fatalf("start %d after the kills: playwatch exited with %v after SIGTERM", i+1, err)
		}
		if i == 0 {
			if left := processesNaming(t, "-D\x00"+tmp+"\x00"); len(left) > 0 {
				t.Errorf("the orphaned initdb %v still runs after the cluster was made", left)
			}
		}
	}
	if b, _ := os.ReadFile(logPath); !strings.Contains(string(b), "waiting for it to end") && len(orphans) > 0 {
		t.Errorf("the start after the kill of playwatch alone did not wait for its initdb %v", orphans)
	}
}

// unmakeFinishedCluster removes the cluster in dir if initdb finished it
// before the kill (a fast machine), once the server it may have started has
// stopped, so that the next start makes the cluster again.
func unmakeFinishedCluster(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		return
	}
	waitFor(t, 30*time.Second, "the server of the finished cluster to stop", func() bool {
		_, err := os.Stat(filepath.Join(dir, "postmaster.pid"))
		return errors.Is(err, fs.ErrNotExist)
	})
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	t.Logf("initdb had finished before the kill; the cluster is removed so that the next start makes it again")
}

// lineWatcher copies what it is written to w and closes seen at the first
// line containing line.
type lineWatcher struct {
	w    io.Writer
	line string
	seen chan struct{}
	buf  []byte
}

func (l *lineWatcher) Write(p []byte) (int, error) {
	if l.seen != nil {
		l.buf = append(l.buf, p...)
		if bytes.Contains(l.buf, []byte(l.line)) {
			close(l.seen)
			l.seen, l.buf = nil, nil
		}
	}
	return l.w.Write(p)
}

// processesNaming lists the pids whose NUL-separated command line contains s.
func processesNaming(t *testing.T, s string) []int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil || !bytes.Contains(append(b, 0), []byte(s)) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		pids = append(pids, pid)
	}
	return pids
}

// A cluster without its postgres database, as an older playwatch killed
// during initdb left it, is reported at once with the command that clears
// it, not after a minute of retries.
func TestManagedPostgresReportsHalfMadeCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	opts := managedPostgresOptions{DataDir: filepath.Join(tempDataDir(t), "pg"), Database: "playwatch", OSUser: "postgres", NoFsync: true}
	pg, err := startManagedPostgres(ctx, opts, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.adminExec(ctx, opts.Database, "DROP DATABASE postgres"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	_, err = startManagedPostgres(ctx, opts, testLogger(t))
	if err == nil || !strings.Contains(err.Error(), "rm -rf "+opts.DataDir) {
		t.Fatalf("err = %v, want the command that removes the half-made cluster", err)
	}
	if took := time.Since(began); took > 30*time.Second {
		t.Errorf("the report took %s", took)
	}
}

// The connection budget (docs/design.md §Status page): the read pool stays
// within maxReadPoolConns whatever STATUS_PAGE_MAX_RENDERS says, and the
// managed cluster admits a server's control and read pools with room to
// spare, also where the control pool is large (many CPUs).
func TestManagedPostgresConnectionBudget(t *testing.T) {
	t.Parallel()
	dbURL := newTestDatabase(t)
	for renders, want := range map[int]int32{1: 2, 4: 5, 15: 16, 64: 16} {
		reads, err := openReadPool(t.Context(), dbURL, time.Second, renders)
		if err != nil {
			t.Fatal(err)
		}
		if n := reads.Config().MaxConns; n != want || int(n) != readPoolConns(renders) {
			t.Errorf("STATUS_PAGE_MAX_RENDERS=%d: a read pool of %d connections, want %d", renders, n, want)
		}
		reads.Close()
	}
	// openDatabase keeps pgxpool's default size, which the budget counts.
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if int(pcfg.MaxConns) != controlPoolConns() {
		t.Errorf("pgxpool's default pool is %d connections, the budget counts %d", pcfg.MaxConns, controlPoolConns())
	}
	if n := managedMaxConnections(controlPoolConns(), readPoolConns(4)); n < 100 || n < controlPoolConns()+readPoolConns(4)+connReserve {
		t.Errorf("max_connections %d on this machine: less than PostgreSQL's default or the budget", n)
	}
	// 64 CPUs and 64 pages: 64 + 16 + 50.
	const many = 130
	if n := managedMaxConnections(64, readPoolConns(64)); n != many {
		t.Errorf("max_connections for 64 CPUs and 64 pages: %d, want %d", n, many)
	}
	opts := managedPostgresOptions{DataDir: filepath.Join(tempDataDir(t), "pg"), Database: "playwatch", OSUser: "postgres", NoFsync: true,
		MaxConnections: managedMaxConnections(64, readPoolConns(64))}
	pg, err := startManagedPostgres(t.Context(), opts, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Stop(context.Background())
	if n := queryInt(t, pg.DSN(), "SELECT current_setting('max_connections')::int"); n != many {
		t.Errorf("the managed cluster's max_connections is %d, want %d", n, many)
	}
}
