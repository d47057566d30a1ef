package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// errDataDirInUse: another playwatch runs the managed services of the data
// directory.
var errDataDirInUse = errors.New("data directory in use")

// errNotRunning: no playwatch runs on the data directory, so a one-off
// command has no services to attach to.
var errNotRunning = errors.New("no playwatch runs on the data directory")

// Files of a data directory besides the services' own.
const (
	lockFileName = "playwatch.lock"
	// attachFileName is what the running playwatch tells one-off commands
	// about the services it runs.
	attachFileName = "playwatch.attach.json"
)

// lockDataDir makes sure one playwatch process at a time runs the managed
// services of a data directory. The kernel drops the lock when the process
// dies, however it dies, so a lock we get means any server still running
// there is an orphan of a crashed run.
func lockDataDir(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create the data directory: %w", err)
	}
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock the data directory: %w", err)
	}
	// A one-off command looking for a running playwatch holds the lock
	// shared for a moment: that is worth a short wait, not a refusal.
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	for deadline := time.Now().Add(time.Second); errors.Is(err, syscall.EWOULDBLOCK) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is used by playwatch pid %s: stop it, or point DATABASE_URL and KAFKA_BROKERS at the services it runs", errDataDirInUse, dir, strings.TrimSpace(string(b)))
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	// What a crashed run published is gone with it; a process that reuses its
	// pid (pid 1 in a container) must not pass for it while it starts.
	if err := os.Remove(filepath.Join(dir, attachFileName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		f.Close()
		return nil, fmt.Errorf("remove the stale attach file: %w", err)
	}
	return func() { f.Close() }, nil
}

// runningPlaywatch is what a running playwatch publishes in its data
// directory for the one-off commands: the services it uses, whether it
// runs them or they are external.
type runningPlaywatch struct {
	PID       int       `json:"pid"`
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	// DatabaseURL has no password: the managed cluster trusts its private
	// socket, and for an external database a command brings its own
	// (DATABASE_URL, PGPASSWORD or ~/.pgpass).
	DatabaseURL string   `json:"database_url"`
	Brokers     []string `json:"brokers"`
	// PGListen is the managed cluster's TCP address (PLAYWATCH_PG_LISTEN),
	// for `playwatch db-url`; empty: socket only, or an external database.
	PGListen string `json:"pg_listen,omitempty"`
	// PGWriterFrom: PLAYWATCH_PG_WRITER_FROM lets the writer in from other
	// hosts over PGListen, so db-url need not say that it does not.
	PGWriterFrom bool `json:"pg_writer_from,omitempty"`
	// EmbeddedBroker: Brokers is the broker it runs, whose byte budget a
	// command's publishing respects too: the budget, the retention and the
	// consumer group whose stored offsets guard the unstored records are the
	// running playwatch's, not the command's.
	EmbeddedBroker bool          `json:"embedded_broker"`
	BrokerMaxBytes int64         `json:"broker_max_bytes,omitempty"`
	TopicRetention time.Duration `json:"topic_retention,omitempty"`
	ConsumerGroup  string        `json:"consumer_group,omitempty"`
	// RawArchive: RAW_ARCHIVE of the playwatch that runs the embedded
	// broker, whose budget then holds raw-pages; an attached crawl follows it.
	RawArchive bool `json:"raw_archive,omitempty"`
	// ManagedPostgres: DatabaseURL is the cluster it runs.
	ManagedPostgres bool `json:"managed_postgres"`
	// KafkaTLS and KafkaSASLMechanism say how Brokers are reached, so that
	// a command without the same settings fails with a clear message. The
	// credentials and key files are not here: a command brings its own
	// KAFKA_TLS* and KAFKA_SASL_* (kafka_security.go).
	KafkaTLS           bool   `json:"kafka_tls,omitempty"`
	KafkaSASLMechanism string `json:"kafka_sasl_mechanism,omitempty"`
}

// publishRunning writes r to the attach file of dir, atomically: a command
// reads the whole file or none. unpublish removes it.
func publishRunning(dir string, r runningPlaywatch) (unpublish func(), err error) {
	r.DatabaseURL = withoutPassword(r.DatabaseURL)
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, attachFileName)
	if err := writeFileAtomic(path, append(b, '\n'), 0o644, nil); err != nil {
		return nil, fmt.Errorf("publish the services for other commands: %w", err)
	}
	return func() { _ = os.Remove(path) }, nil
}

// withoutPassword removes the password from a postgres:// URL, in its user
// part or its parameters.
func withoutPassword(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return ""
	}
	if u.User != nil {
		u.User = url.User(u.User.Username())
	}
	q := u.Query()
	if q.Has("password") || q.Has("sslpassword") {
		q.Del("password")
		q.Del("sslpassword")
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// findRunning returns what the playwatch running on dir published. A file
// that no live holder of the lock wrote is stale and ignored: the lock is
// free (its writer died), or another process holds it and has not
// published yet.
func findRunning(dir string) (runningPlaywatch, error) {
	lock, err := os.Open(filepath.Join(dir, lockFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return runningPlaywatch{}, fmt.Errorf("%w %s", errNotRunning, dir)
	}
	if err != nil {
		return runningPlaywatch{}, fmt.Errorf("look for a running playwatch: %w", err)
	}
	defer lock.Close()
	var r runningPlaywatch
	attachPath := filepath.Join(dir, attachFileName)
	b, readErr := os.ReadFile(attachPath)
	if readErr == nil {
		err := json.Unmarshal(b, &r)
		if err == nil && (r.PID <= 0 || r.DatabaseURL == "" || len(r.Brokers) == 0) {
			err = errors.New("no pid, database_url or brokers")
		}
		if err != nil {
			return runningPlaywatch{}, fmt.Errorf("%s is not what a running playwatch writes (%w): stop the playwatch on %s and start it again", attachPath, err, dir)
		}
	} else if !errors.Is(readErr, fs.ErrNotExist) {
		return runningPlaywatch{}, fmt.Errorf("look for a running playwatch: %w", readErr)
	}
	// A shared lock we get means nobody holds the exclusive one.
	switch err := syscall.Flock(int(lock.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); {
	case err == nil:
		_ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		if readErr == nil {
			return runningPlaywatch{}, fmt.Errorf("%w %s (%s is left from pid %d, which is gone)", errNotRunning, dir, attachFileName, r.PID)
		}
		return runningPlaywatch{}, fmt.Errorf("%w %s", errNotRunning, dir)
	case !errors.Is(err, syscall.EWOULDBLOCK):
		return runningPlaywatch{}, fmt.Errorf("look for a running playwatch: lock %s: %w", lock.Name(), err)
	}
	holder, _ := io.ReadAll(lock)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(holder)))
	if readErr != nil || r.PID != pid {
		return runningPlaywatch{}, fmt.Errorf("playwatch pid %d holds %s but has not published its services yet: wait until it logs \"playwatch ready\" and run this again (a playwatch too old to publish them needs a restart with this version)", pid, dir)
	}
	return r, nil
}
