package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
)

// TestMain stops the shared test services once every test has run.
func TestMain(m *testing.M) {
	code := m.Run()
	testPG.stop()
	stopApacheKafkaClusters()
	os.Exit(code)
}

// testPostgres is one PostgreSQL server per test binary: the managed
// cluster code in a temp dir, or TEST_DATABASE_URL when set. Each test gets
// its own database cloned from a migrated template. In the managed cluster
// the superuser creates the databases and the writer role owns them, as in
// the appliance.
type testPostgres struct {
	once     sync.Once
	err      error
	baseURL  *url.URL // any database of the server; the path is replaced per test
	adminURL string   // creates and drops the databases
	owner    string   // " OWNER role" of each database, or empty
	server   *managedPostgres
	dir      string
	seq      atomic.Int64
}

var testPG testPostgres

const testTemplateDB = "pwt_template"

func (tp *testPostgres) start() error {
	tp.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		raw := os.Getenv("TEST_DATABASE_URL")
		if raw == "" {
			tp.dir, tp.err = os.MkdirTemp("", "pwtest-")
			if tp.err != nil {
				return
			}
			// The server may run as another OS user, which must reach the dir.
			if tp.err = os.Chmod(tp.dir, 0o755); tp.err != nil {
				return
			}
			// The parallel tests (make test's -parallel) each hold a
			// pool or two on this server: room beyond the default 100.
			tp.server, tp.err = startManagedPostgres(ctx, managedPostgresOptions{
				DataDir: tp.dir + "/pg", Database: "playwatch", OSUser: "postgres", NoFsync: true,
				MaxConnections: 300,
			}, logger)
			if tp.err != nil {
				return
			}
			raw = tp.server.DSN()
			tp.adminURL, tp.owner = tp.server.adminDSN("postgres"), " OWNER "+pgWriterRole
		}
		if tp.adminURL == "" {
			tp.adminURL = raw
		}
		tp.baseURL, tp.err = url.Parse(raw)
		if tp.err != nil {
			return
		}
		tp.err = tp.createTemplate(ctx, logger)
	})
	return tp.err
}

func (tp *testPostgres) urlFor(db string) string {
	u := *tp.baseURL
	u.Path = "/" + db
	return u.String()
}

func (tp *testPostgres) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, tp.adminURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func (tp *testPostgres) createTemplate(ctx context.Context, logger *slog.Logger) error {
	if err := tp.exec(ctx, "DROP DATABASE IF EXISTS "+testTemplateDB+" WITH (FORCE)"); err != nil {
		return err
	}
	if err := tp.exec(ctx, "CREATE DATABASE "+testTemplateDB+tp.owner); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, tp.urlFor(testTemplateDB))
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrate(ctx, pool, logger)
}

func (tp *testPostgres) stop() {
	if tp.server != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = tp.server.Stop(ctx)
	}
	if tp.dir != "" {
		_ = os.RemoveAll(tp.dir)
	}
}

// newTestDatabase creates a migrated database for one test and returns its
// URL; it is dropped when the test ends.
func newTestDatabase(t testing.TB) string {
	t.Helper()
	if err := testPG.start(); err != nil {
		t.Fatalf("test postgres: %v", err)
	}
	name := fmt.Sprintf("pwt_%d_%d", os.Getpid(), testPG.seq.Add(1))
	ctx := context.Background()
	if err := testPG.exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+testTemplateDB+testPG.owner); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	t.Cleanup(func() {
		if err := testPG.exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	return testPG.urlFor(name)
}

// newTestPool is a pool on a fresh migrated database.
func newTestPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return newTestPoolFor(t, newTestDatabase(t))
}

// newTestPoolFor is a pool on the database at url, closed after the test.
func newTestPoolFor(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatalf("connect test database: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// newTestBroker starts an embedded broker on a free loopback port with the
// playwatch topics and returns its seed addresses.
func newTestBroker(t testing.TB, dataDir string) (*embeddedBroker, []string) {
	t.Helper()
	b, err := startEmbeddedBroker(embeddedBrokerOptions{
		Addr: "127.0.0.1:0", DataDir: dataDir, RetentionCheck: time.Minute,
	}, testLogger(t))
	if err != nil {
		t.Fatalf("embedded broker: %v", err)
	}
	t.Cleanup(b.Close)
	createTestTopics(t, b.Addrs(), topicSpec{Partitions: 3, Replication: -1, Retention: time.Hour})
	return b, b.Addrs()
}

func createTestTopics(t testing.TB, brokers []string, spec topicSpec) {
	t.Helper()
	withAdmin(t, brokers, func(ctx context.Context, adm *kadm.Client) {
		if err := ensureTopics(ctx, adm, spec, createdTopics, testLogger(t)); err != nil {
			t.Fatalf("create topics: %v", err)
		}
	})
}

// startDedicatedPostgres starts a managed cluster of a test's own in dataDir,
// for a test that stops and restarts it or measures it without disturbing
// the shared server, and returns it with a pool on its migrated database.
// with changes the options first. A test that restarts it with the returned
// options stops the new server itself.
func startDedicatedPostgres(t testing.TB, dataDir string, noFsync bool, with ...func(*managedPostgresOptions)) (*managedPostgres, *pgxpool.Pool, managedPostgresOptions) {
	t.Helper()
	ctx := context.Background()
	opts := managedPostgresOptions{DataDir: filepath.Join(dataDir, "postgres"), Database: managedDatabase, OSUser: "postgres", NoFsync: noFsync}
	for _, f := range with {
		f(&opts)
	}
	pg, err := startManagedPostgres(ctx, opts, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop(context.Background()) })
	pool := newTestPoolFor(t, pg.DSN())
	if err := migrate(ctx, pool, testLogger(t)); err != nil {
		t.Fatal(err)
	}
	return pg, pool, opts
}
