package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
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

// tcpURL is the URL of the playwatch database over TCP at addr for role,
// with password unless it is empty.
func tcpURL(addr, role, password string) string {
	u := url.URL{Scheme: "postgres", User: url.User(role), Host: addr, Path: "/" + managedDatabase, RawQuery: "sslmode=disable&connect_timeout=10"}
	if password != "" {
		u.User = url.UserPassword(role, password)
	}
	return u.String()
}

// connectErr is the error of connecting to dsn and running sql, nil when both work.
func connectErr(dsn, sql string) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// checkAccess checks what each role may do over TCP at addr in a cluster
// whose data directory is pgData, and that the writer is no superuser.
func checkAccess(t *testing.T, pool *pgxpool.Pool, pgData, addr string) {
	t.Helper()
	ctx := context.Background()
	var super bool
	if err := pool.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super {
		t.Error("playwatch writes as a superuser")
	}
	pw, err := readPasswords(pgPassFile(pgData))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(pgPassFile(pgData)); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("the password file's mode is %v, want 0600", fi.Mode().Perm())
	}
	for _, role := range []string{pgWriterRole, pgReaderRole, pgAdminRole} {
		if err := connectErr(tcpURL(addr, role, ""), "SELECT 1"); err == nil {
			t.Errorf("%s connects over TCP without a password", role)
		}
		if err := connectErr(tcpURL(addr, role, "wrong"), "SELECT 1"); err == nil {
			t.Errorf("%s connects over TCP with a wrong password", role)
		}
	}
	reader := tcpURL(addr, pgReaderRole, pw[pgReaderRole])
	if err := connectErr(reader, "SELECT count(*) FROM apps_registry_application"); err != nil {
		t.Errorf("the reader cannot read: %v", err)
	}
	if err := connectErr(reader, "INSERT INTO apps_registry_application (package_name) VALUES ('com.example.reader')"); !isPgError(err, "42501") {
		t.Errorf("an insert by the reader: %v, want insufficient privilege", err)
	}
	if err := connectErr(reader, "CREATE TABLE reader_table (n int)"); err == nil {
		t.Error("the reader can create a table")
	}
	// The notifier's secrets are not the reader's, whether migration 12 ran
	// after the grants (a new cluster) or the grants after it (a restart).
	if err := connectErr(reader, "SELECT count(*) FROM notify_destinations"); err != nil {
		t.Errorf("the reader cannot read notify_destinations: %v", err)
	}
	if err := connectErr(reader, "SELECT count(*) FROM "+readerDeniedTable); !isPgError(err, "42501") {
		t.Errorf("the reader reading %s: %v, want permission denied", readerDeniedTable, err)
	}
	writer := tcpURL(addr, pgWriterRole, pw[pgWriterRole])
	if err := connectErr(writer, "INSERT INTO apps_registry_application (package_name) VALUES ('com.example.writer') ON CONFLICT DO NOTHING"); err != nil {
		t.Errorf("the writer cannot write over TCP: %v", err)
	}
	if err := connectErr(writer, "COPY (SELECT 1) TO PROGRAM 'true'"); !isPgError(err, "42501") {
		t.Errorf("COPY TO PROGRAM as the writer: %v, want insufficient privilege", err)
	}
	// A table a later migration adds is the reader's to read too.
	name := fmt.Sprintf("later_table_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, "CREATE TABLE "+name+" (n int)"); err != nil {
		t.Fatal(err)
	}
	if err := connectErr(reader, "SELECT count(*) FROM "+name); err != nil {
		t.Errorf("the reader cannot read a table added later: %v", err)
	}
}

// With PLAYWATCH_PG_LISTEN on loopback, TCP asks every role for its
// password; the writer is no superuser; the reader reads and cannot write;
// `playwatch db-url` prints URLs that work; another OS user gets nothing
// without a password, over TCP or the socket.
func TestManagedPostgresAccessOverTCP(t *testing.T) {
	t.Parallel()
	dataDir := tempDataDir(t)
	addr := freeAddr(t)
	pg, pool, opts := startDedicatedPostgres(t, dataDir, true, func(o *managedPostgresOptions) { o.Listen = addr })
	checkAccess(t, pool, opts.DataDir, addr)

	// db-url serves the cluster of a running playwatch: this test passes
	// for one, as `run` would publish it.
	passForRunning(t, dataDir, pg.DSN(), addr)
	env := map[string]string{"PLAYWATCH_DATA_DIR": dataDir, "DATABASE_URL": ""}
	for _, args := range [][]string{{"db-url"}, {"db-url", "--reader"}} {
		var out, errOut syncBuffer
		if err := run(context.Background(), args, envFunc(env), &out, &errOut); err != nil {
			t.Fatalf("playwatch %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
		}
		dsn := strings.TrimSpace(out.String())
		if !strings.Contains(dsn, "@"+addr+"/") {
			t.Errorf("playwatch %s printed %q, want a URL of %s", strings.Join(args, " "), dsn, addr)
		}
		if err := connectErr(dsn, "SELECT count(*) FROM reviews"); err != nil {
			t.Errorf("the URL of playwatch %s: %v", strings.Join(args, " "), err)
		}
	}

	if os.Geteuid() != 0 {
		skipOrFailUnderCI(t, "the checks as another OS user need root")
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		skipOrFailUnderCI(t, "psql is not installed (Debian: apt-get install postgresql-client)")
	}
	host, port, _ := net.SplitHostPort(addr)
	pw, _ := readPasswords(pgPassFile(opts.DataDir))
	for _, c := range []struct {
		what, host, role, password string
		ok                         bool
	}{
		{"the writer over TCP without a password", host, pgWriterRole, "", false},
		{"the superuser over TCP without a password", host, pgAdminRole, "", false},
		{"the reader over TCP with its password", host, pgReaderRole, pw[pgReaderRole], true},
		{"the writer over the socket", pg.socketDir, pgWriterRole, "", false},
		{"the superuser over the socket", pg.socketDir, pgAdminRole, "", false},
	} {
		script := fmt.Sprintf(`exec %s -w -X -At -h '%s' -p %s -U %s -d playwatch -c 'SELECT count(*) FROM reviews'`, psql, c.host, port, c.role)
		cmd := exec.Command("su", "nobody", "-s", "/bin/sh", "-c", script)
		cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10", "PGPASSFILE=/nonexistent")
		if c.password != "" {
			cmd.Env = append(cmd.Env, "PGPASSWORD="+c.password)
		}
		out, err := cmd.CombinedOutput()
		if (err == nil) != c.ok {
			t.Errorf("as the OS user nobody, %s: %v %s", c.what, err, out)
		}
	}
}

// nonLoopbackIPv4 is an IPv4 address of this host other than loopback;
// under CI=true a host without one fails the test.
func nonLoopbackIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	skipOrFailUnderCI(t, "this host has no non-loopback IPv4 address")
	return ""
}

// A cluster made by an older playwatch (superuser playwatch owning every
// table, trust over TCP) is moved to the current roles at its next start:
// its rows stay, the writer owns the tables and is no superuser, postgres is
// the superuser, and TCP asks for passwords.
func TestManagedPostgresUpgradesLegacyCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := freeAddr(t)
	_, portStr, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portStr)
	dataDir := filepath.Join(tempDataDir(t), "postgres")
	makeLegacyCluster(t, dataDir, port)

	opts := managedPostgresOptions{DataDir: dataDir, Database: managedDatabase, OSUser: "postgres", Listen: addr, NoFsync: true}
	for start := 1; start <= 2; start++ {
		pg, err := startManagedPostgres(ctx, opts, testLogger(t))
		if err != nil {
			t.Fatalf("start %d: %v", start, err)
		}
		pool, err := pgxpool.New(ctx, pg.DSN())
		if err != nil {
			t.Fatal(err)
		}
		if err := migrate(ctx, pool, testLogger(t)); err != nil {
			t.Fatalf("start %d: migrate as the writer: %v", start, err)
		}
		if n := count(t, pool, `SELECT count(*) FROM apps_registry_application WHERE package_name = 'org.telegram.messenger'`); n != 1 {
			t.Errorf("start %d: the legacy cluster's app is gone", start)
		}
		if n := count(t, pool, `SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'v', 'S') AND relowner <> (SELECT oid FROM pg_roles WHERE rolname = 'playwatch')`); n != 0 {
			t.Errorf("start %d: %d tables, views or sequences are not the writer's", start, n)
		}
		if n := count(t, pool, `SELECT count(*) FROM pg_roles WHERE oid = 10 AND rolname = 'postgres' AND rolsuper`); n != 1 {
			t.Errorf("start %d: the bootstrap superuser is not postgres", start)
		}
		if n := count(t, pool, `SELECT count(*) FROM pg_roles WHERE rolname = $1`, pgUpgradeRole); n != 0 {
			t.Errorf("start %d: the upgrade's helper role is left", start)
		}
		// The consumer's path: staging tables, COPY, the trigger.
		if _, err := pool.Exec(ctx, `UPDATE apps_registry_application SET category = 'COMMUNICATION'`); err != nil {
			t.Errorf("start %d: the writer cannot update: %v", start, err)
		}
		checkAccess(t, pool, dataDir, addr)
		if err := connectErr(tcpURL(addr, pgReaderRole, mustPasswords(t, dataDir)[pgReaderRole]), "SELECT count(*) FROM legacy_dashboard"); err != nil {
			t.Errorf("start %d: the reader cannot read a view made by the old superuser: %v", start, err)
		}
		pool.Close()
		if err := pg.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func mustPasswords(t *testing.T, pgData string) map[string]string {
	t.Helper()
	pw, err := readPasswords(pgPassFile(pgData))
	if err != nil {
		t.Fatal(err)
	}
	return pw
}

// makeLegacyCluster makes a cluster in dataDir as playwatch did before it
// had roles: initdb with superuser playwatch and trust everywhere, the
// database and the schema made by that superuser, a registered app and a
// view a dashboard user added.
func makeLegacyCluster(t *testing.T, dataDir string, port int) {
	t.Helper()
	ctx := context.Background()
	binDir, err := findPostgresBinDir()
	if err != nil {
		t.Fatal(err)
	}
	cred, err := postgresCredential("postgres")
	if err != nil {
		t.Fatal(err)
	}
	if err := makeOwnedDir(dataDir, cred); err != nil {
		t.Fatal(err)
	}
	initdb := exec.Command(filepath.Join(binDir, "initdb"), "-D", dataDir, "-U", legacySuperuser, "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	m := &managedPostgres{opts: managedPostgresOptions{DataDir: dataDir, NoFsync: true}, port: port,
		stderr: &tailBuffer{max: 8 << 10}, exited: make(chan struct{}), logger: testLogger(t)}
	m.socketDir = postgresSocketDir(dataDir, port)
	if err := makeOwnedDir(m.socketDir, cred); err != nil {
		t.Fatal(err)
	}
	if err := m.startServer(binDir, cred); err != nil {
		t.Fatal(err)
	}
	defer m.Stop(ctx)
	super := func(db string) string { return managedPostgresURL(m.socketDir, port, legacySuperuser, db) }
	waitFor(t, 30*time.Second, "the legacy cluster", func() bool { return connectErr(super("postgres"), "SELECT 1") == nil })
	if err := connectErr(super("postgres"), "CREATE DATABASE playwatch"); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, super(managedDatabase))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := migrate(ctx, pool, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	registerApps(t, pool, "org.telegram.messenger")
	if _, err := pool.Exec(ctx, "CREATE VIEW legacy_dashboard AS SELECT package_name FROM apps_registry_application"); err != nil {
		t.Fatal(err)
	}
}

// passForRunning locks dataDir and publishes the attach file of a running
// playwatch whose managed cluster is at dsn and listens on addr, as `run`
// does, so that db-url serves it.
func passForRunning(t *testing.T, dataDir, dsn, addr string) {
	t.Helper()
	holdDataDir(t, dataDir)
	if _, err := publishRunning(dataDir, runningPlaywatch{PID: os.Getpid(), Version: version, DatabaseURL: dsn, Brokers: []string{"127.0.0.1:9"},
		PGListen: addr, ManagedPostgres: true}); err != nil {
		t.Fatal(err)
	}
}
