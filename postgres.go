package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// managedPostgresOptions says where and how to run a private cluster.
type managedPostgresOptions struct {
	DataDir  string // the cluster's PGDATA, created by initdb on first start
	Database string // created on first start
	OSUser   string // the server's OS user when playwatch runs as root
	Listen   string // optional TCP host:port; empty: unix socket only
	// WriterFrom are the non-loopback networks the writer may connect from
	// over TCP (PLAYWATCH_PG_WRITER_FROM); other hosts get the reader only.
	WriterFrom []netip.Prefix
	// NoFsync trades crash safety for speed; for throwaway test clusters only.
	NoFsync bool
	// initdbStarted, set by a test, is called with each initdb process
	// once it runs (before it is waited for): the test interrupts it there.
	initdbStarted func(*os.Process)
	// MaxConnections is the server's max_connections
	// (managedMaxConnections); 0 leaves PostgreSQL's default of 100.
	MaxConnections int
}

// connReserve is what the managed cluster admits beyond one server's own
// pools: the one-off commands, psql and Grafana, and other servers.
const connReserve = 50

// controlPoolConns is the size of the appliance's pool (the lease, the
// consumer, the crawler, the sentiment job, the API's writes): pgxpool's
// default, max(4, CPUs), which openDatabase keeps.
func controlPoolConns() int { return max(4, runtime.NumCPU()) }

// managedMaxConnections is the managed cluster's max_connections: one
// server's control and read pools and connReserve, and never less than
// PostgreSQL's default. Then a crowd of page or API readers cannot take the
// connections the lease and the consumer need.
func managedMaxConnections(controlConns, readConns int) int {
	return max(100, controlConns+readConns+connReserve)
}

// managedPostgres is a PostgreSQL server playwatch started from the
// installed binaries and stops on exit.
type managedPostgres struct {
	opts      managedPostgresOptions
	socketDir string
	port      int
	cmd       *exec.Cmd
	stderr    *tailBuffer
	exited    chan struct{}
	logger    *slog.Logger
	admin     string // the superuser that sets the cluster up
	// tlsCert and tlsKey are the files of the TCP listener's TLS (postgres_tls.go).
	tlsCert, tlsKey string
}

// managedDatabase is the database playwatch uses in a managed cluster.
const managedDatabase = "playwatch"

// startManagedPostgres initialises the cluster if needed, takes over or
// clears what a crashed run left behind, starts the server and waits until
// it accepts connections.
func startManagedPostgres(ctx context.Context, opts managedPostgresOptions, logger *slog.Logger) (*managedPostgres, error) {
	started := time.Now()
	binDir, err := findPostgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := postgresCredential(opts.OSUser)
	if err != nil {
		return nil, err
	}
	m := &managedPostgres{opts: opts, port: pgListenPort(opts.Listen), stderr: &tailBuffer{max: 8 << 10}, exited: make(chan struct{}), logger: logger}
	m.socketDir = postgresSocketDir(opts.DataDir, m.port)
	if err := os.MkdirAll(filepath.Dir(opts.DataDir), 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", filepath.Dir(opts.DataDir), err)
	}
	if err := makeOwnedDir(m.socketDir, cred); err != nil {
		return nil, err
	}
	for _, d := range []string{opts.DataDir, m.socketDir} {
		if err := checkReachable(d, cred, opts.OSUser); err != nil {
			return nil, err
		}
	}
	if err := m.initdb(ctx, binDir, cred); err != nil {
		return nil, err
	}
	// The server of a playwatch killed a moment ago may still be shutting
	// down and deleting its files: it ends before they are handed over.
	if err := m.clearLeftovers(ctx); err != nil {
		return nil, err
	}
	for _, d := range []string{opts.DataDir, m.socketDir} {
		if err := handOver(d, cred); err != nil {
			return nil, err
		}
	}
	if err := m.writeAccessRules(cred); err != nil {
		return nil, err
	}
	if opts.Listen != "" {
		if m.tlsCert, m.tlsKey, err = m.ensureTLSFiles(cred); err != nil {
			return nil, err
		}
	}
	if err := m.startServer(binDir, cred); err != nil {
		return nil, err
	}
	if err := m.waitReady(ctx); err != nil {
		return nil, errors.Join(err, m.stopAfterFailedStart(ctx))
	}
	if err := m.setUpAccess(ctx); err != nil {
		return nil, errors.Join(err, m.stopAfterFailedStart(ctx))
	}
	logger.Info("managed postgres ready", "data_dir", opts.DataDir, "socket_dir", m.socketDir,
		"tcp", opts.Listen, "pid", m.cmd.Process.Pid, "took", time.Since(started).Round(time.Millisecond))
	return m, nil
}

// DSN is the URL playwatch writes the playwatch database with.
func (m *managedPostgres) DSN() string {
	return managedPostgresDSN(m.socketDir, m.port, m.opts.Database)
}

// managedPostgresDSN is the URL of a database of a managed cluster for the
// writer role, over the socket.
func managedPostgresDSN(socketDir string, port int, db string) string {
	return managedPostgresURL(socketDir, port, pgWriterRole, db)
}

// managedPostgresURL is the URL of database db for role over the socket.
func managedPostgresURL(socketDir string, port int, role, db string) string {
	u := url.URL{Scheme: "postgres", User: url.User(role), Path: "/" + db,
		RawQuery: url.Values{"host": {socketDir}, "port": {strconv.Itoa(port)}, "sslmode": {"disable"}}.Encode()}
	return u.String()
}

// pgListenPort is the port of a managed cluster: the one of its TCP listener
// if it has one, else PostgreSQL's default (it also names the socket file).
func pgListenPort(listen string) int {
	if listen == "" {
		return 5432
	}
	_, p, _ := net.SplitHostPort(listen)
	port, _ := strconv.Atoi(p)
	return port
}

// Stop shuts the server down (fast shutdown: sessions are ended, committed
// work is kept) and escalates to an immediate stop when ctx ends first.
func (m *managedPostgres) Stop(ctx context.Context) error {
	select {
	case <-m.exited:
		return nil
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-m.exited:
		m.logger.Info("managed postgres stopped")
		return nil
	case <-ctx.Done():
	}
	_ = m.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-m.exited:
	case <-time.After(5 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	return fmt.Errorf("managed postgres: fast shutdown did not finish in time, stopped immediately: %w", ctx.Err())
}

// stopAfterFailedStart stops a server whose start-up failed, within a bound
// of its own: ctx may be what ended the start.
func (m *managedPostgres) stopAfterFailedStart(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	return m.Stop(sctx)
}

// findPostgresBinDir finds a directory holding both initdb and postgres:
// PATH first, then the newest /usr/lib/postgresql/*/bin.
func findPostgresBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin: install them (Debian: apt-get install postgresql) or set DATABASE_URL")
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// postgresCredential returns the OS user to run the server as: PostgreSQL
// refuses to run as root, so root hands it to an unprivileged user.
func postgresCredential(osUser string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(osUser)
	if err != nil {
		return nil, fmt.Errorf("running as root, the managed PostgreSQL needs the unprivileged OS user %q (PLAYWATCH_PG_USER): %w; create it (useradd --system %s) or set DATABASE_URL", osUser, err, osUser)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// postgresSocketDir keeps the socket beside the data directory, unless that
// path is too long for a unix socket (108 bytes), in which case it moves to
// a per-cluster directory under the system temp dir.
func postgresSocketDir(dataDir string, port int) string {
	dir := dataDir + "-socket"
	if len(dir)+len(fmt.Sprintf("/.s.PGSQL.%d", port)) < 100 {
		return dir
	}
	sum := sha256.Sum256([]byte(dataDir))
	return filepath.Join(os.TempDir(), "playwatch-pg-"+hex.EncodeToString(sum[:6]))
}

// makeOwnedDir creates dir (0700, its parents 0755) for the server's OS user.
// A dir that exists must be a directory of that user or of playwatch's, not
// a symbolic link: the socket directory may sit in a shared /tmp, where
// another user could have made it first to catch the trusted connections.
func makeOwnedDir(dir string, cred *syscall.Credential) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("create the parent of %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err // an *fs.PathError: it names dir
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	uid := uint32(os.Geteuid())
	if cred != nil {
		uid = cred.Uid
	}
	if owner := fi.Sys().(*syscall.Stat_t).Uid; !fi.IsDir() || (owner != uid && owner != uint32(os.Geteuid())) {
		return fmt.Errorf("%s is not a directory of playwatch or of the postgres OS user (owner uid %d, mode %s): remove it", dir, owner, fi.Mode())
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if cred == nil {
		return nil
	}
	if err := os.Lchown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
		return fmt.Errorf("hand the directory to the postgres OS user: %w", err)
	}
	return nil
}

// handOver gives everything under dir to the server's OS user (a directory
// made by a playwatch run as another user, or for another PLAYWATCH_PG_USER).
// A file that vanishes meanwhile needs no owner.
func handOver(dir string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	// A tree whose top already is the user's was handed over, or made by
	// the user: walking it as root again would only give a user who can
	// swap a directory for a symbolic link mid-walk a way to own other files.
	if fi, err := os.Lstat(dir); err == nil && fi.Sys().(*syscall.Stat_t).Uid == cred.Uid {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err == nil {
			err = os.Lchown(p, int(cred.Uid), int(cred.Gid))
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("hand the cluster's files to the postgres OS user: %w", err)
		}
		return nil
	})
}

// checkReachable fails early, with a fix to apply, when the server's OS user
// could not walk down to dir (e.g. a data directory under /root).
func checkReachable(dir string, cred *syscall.Credential, osUser string) error {
	if cred == nil {
		return nil
	}
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		mode := fi.Mode().Perm()
		ok := mode&0o001 != 0 || (st.Uid == cred.Uid && mode&0o100 != 0) || (st.Gid == cred.Gid && mode&0o010 != 0)
		if !ok {
			return fmt.Errorf("the OS user %s that runs the managed PostgreSQL cannot enter %s (mode %o): choose a PLAYWATCH_DATA_DIR outside it or run chmod o+x %s", osUser, p, mode, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// initdb makes the cluster when the data directory holds none. initdb
// writes into a directory beside it, renamed into place once initdb has
// finished: a start killed half-way leaves nothing a later start would take
// for a cluster.
func (m *managedPostgres) initdb(ctx context.Context, binDir string, cred *syscall.Credential) error {
	dir := m.opts.DataDir
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s is neither empty nor a PostgreSQL data directory (no PG_VERSION)", dir)
	}
	tmp := dir + "-initdb"
	lock, err := m.takeInitdbDir(ctx, tmp, cred)
	if err != nil {
		return err
	}
	defer lock.Close()
	m.logger.Info("initialising managed postgres cluster", "data_dir", dir)
	// The access rules are replaced before the server starts (pg_hba.conf).
	args := []string{"-D", tmp, "-U", pgAdminRole, "--auth-local=trust", "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C.UTF-8"}
	if m.opts.NoFsync {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), args...)
	cmd.Dir = tmp
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	// initdb and the server it runs inherit the lock: a later start knows
	// they still run after a kill of playwatch alone.
	cmd.ExtraFiles = []*os.File{lock}
	// Interrupted, initdb removes what it wrote and ends its server.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Start()
	if err == nil {
		if m.opts.initdbStarted != nil {
			m.opts.initdbStarted(cmd.Process)
		}
		err = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("initdb %s: %w\n%s", tmp, err, bytes.TrimSpace(out.Bytes()))
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("move the new cluster into place: %w", err)
	}
	if !m.opts.NoFsync {
		if err := syncDir(filepath.Dir(dir)); err != nil {
			return err
		}
	}
	return nil
}

// takeInitdbDir makes tmp an empty directory owned by the server's OS user
// and returns it open and locked. What a killed start left there is removed
// once every process of that start has ended: an initdb that outlived its
// playwatch, and the server it runs, hold the lock.
func (m *managedPostgres) takeInitdbDir(ctx context.Context, tmp string, cred *syscall.Credential) (*os.File, error) {
	if err := makeOwnedDir(tmp, cred); err != nil {
		return nil, err
	}
	f, err := os.Open(tmp)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for waiting := false; ; waiting = true {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", tmp, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("an initdb of an earlier start still runs in %s after 5 minutes: end it (fuser -vk %s) and start again", tmp, tmp)
		}
		if !waiting {
			m.logger.Warn("an initdb of an earlier start still runs; waiting for it to end", "dir", tmp)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	entries, err := os.ReadDir(tmp)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read %s: %w", tmp, err)
	}
	if len(entries) > 0 {
		m.logger.Warn("removing the unfinished cluster of an interrupted initdb", "dir", tmp)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(tmp, e.Name())); err != nil {
			f.Close()
			return nil, fmt.Errorf("clear %s: %w", tmp, err)
		}
	}
	return f, nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// clearLeftovers deals with a postmaster.pid left by a crash: a server
// still running on this data directory (its parent playwatch was killed) is
// shut down; a pid file whose process is gone or is something else is removed.
func (m *managedPostgres) clearLeftovers(ctx context.Context) error {
	pidFile := filepath.Join(m.opts.DataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", pidFile, err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if pid > 0 && isPostmasterOf(pid, m.opts.DataDir) {
		m.logger.Warn("a postgres server from an earlier run still owns the data directory; shutting it down", "pid", pid)
		if err := stopOrphanPostmaster(ctx, pid); err != nil {
			return err
		}
		return nil
	}
	m.logger.Warn("removing stale postmaster.pid left by a crash", "pid", pid)
	// It may also be vanishing now: a server that was ending removes it last.
	if err := os.Remove(pidFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", pidFile, err)
	}
	_ = os.Remove(filepath.Join(m.socketDir, fmt.Sprintf(".s.PGSQL.%d.lock", m.port)))
	return nil
}

func stopOrphanPostmaster(ctx context.Context, pid int) error {
	proc, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	_ = proc.Signal(syscall.SIGINT)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if proc.Signal(syscall.Signal(0)) != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	_ = proc.Signal(syscall.SIGKILL)
	time.Sleep(500 * time.Millisecond)
	if proc.Signal(syscall.Signal(0)) == nil {
		return fmt.Errorf("postgres pid %d from an earlier run does not stop", pid)
	}
	return nil
}

func (m *managedPostgres) startServer(binDir string, cred *syscall.Credential) error {
	args := []string{
		"-D", m.opts.DataDir,
		"-k", m.socketDir,
		"-p", strconv.Itoa(m.port),
		"-c", "listen_addresses=" + pgListenHost(m.opts.Listen),
		"-c", "unix_socket_permissions=0700",
		// Server logs rotate daily inside PGDATA and overwrite last week's file.
		"-c", "logging_collector=on",
		"-c", "log_directory=log",
		"-c", "log_filename=postgresql-%a.log",
		"-c", "log_truncate_on_rotation=on",
		"-c", "log_rotation_age=1d",
		"-c", "log_rotation_size=0",
	}
	if m.tlsCert != "" {
		args = append(args, "-c", "ssl=on", "-c", "ssl_cert_file="+m.tlsCert, "-c", "ssl_key_file="+m.tlsKey)
	}
	if m.opts.MaxConnections > 0 {
		args = append(args, "-c", "max_connections="+strconv.Itoa(m.opts.MaxConnections))
	}
	if m.opts.NoFsync {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	cmd.Dir = m.opts.DataDir
	cmd.Stdout = m.stderr
	cmd.Stderr = m.stderr
	cmd.SysProcAttr = serverProcAttr(cred)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	m.cmd = cmd
	go func() {
		_ = cmd.Wait()
		close(m.exited)
	}()
	return nil
}

// waitReady waits until the server answers and finds the superuser that
// sets it up: postgres, or playwatch in a cluster of an older playwatch.
func (m *managedPostgres) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		m.admin = pgAdminRole
		err := m.adminExec(ctx, "postgres", "SELECT 1")
		if isPgError(err, "28000") { // no such role
			m.admin = legacySuperuser
			err = m.adminExec(ctx, "postgres", "SELECT 1")
		}
		if err == nil {
			return nil
		}
		if isPgError(err, "3D000") {
			// initdb makes the postgres database last: an older playwatch
			// killed during initdb left this one half-made.
			return fmt.Errorf("%s is a half-made cluster (initdb was interrupted; it has no postgres database): if it holds nothing you need, remove it (rm -rf %s) and start again", m.opts.DataDir, m.opts.DataDir)
		}
		select {
		case <-m.exited:
			return fmt.Errorf("postgres exited during start-up (%s): %s", m.cmd.ProcessState, m.stderr.String())
		case <-ctx.Done():
			return fmt.Errorf("postgres did not accept connections on %s: %w (last error: %v)", m.socketDir, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// isPgError reports whether err is an error PostgreSQL answered with code.
func isPgError(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// tailBuffer keeps the last max bytes written to it: the server's early
// output, for error messages.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.b))
}
