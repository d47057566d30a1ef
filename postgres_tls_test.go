package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// psqlAsNobody runs sql with psql as the OS user nobody against the
// playwatch database at host:port as role, with password and sslmode (and
// rootCert for the verify modes), and returns its output.
func psqlAsNobody(t *testing.T, psql, addr, role, password, sslmode, rootCert, sql string) (string, error) {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	script := fmt.Sprintf(`exec %s -w -X -At -h '%s' -p %s -U %s -d %s -c "%s"`, psql, host, port, role, managedDatabase, sql)
	cmd := exec.Command("su", "nobody", "-s", "/bin/sh", "-c", script)
	cmd.SysProcAttr = childProcAttr(false)
	cmd.Env = append(os.Environ(), "PGCONNECT_TIMEOUT=10", "PGPASSFILE=/nonexistent", "PGPASSWORD="+password, "PGSSLMODE="+sslmode)
	if rootCert != "" {
		cmd.Env = append(cmd.Env, "PGSSLROOTCERT="+rootCert)
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// Beyond loopback the managed cluster speaks TLS and lets other hosts in as
// the reader only: as the OS user nobody, over this host's non-loopback
// address, the writer is refused with or without TLS, the reader is refused
// without TLS and gets in with it (also checking the certificate against
// the host's address); `playwatch db-url` says sslmode=require. With
// PLAYWATCH_PG_WRITER_FROM naming the address's network the writer gets in,
// with TLS only, and the certificate of the first start is reused.
func TestManagedPostgresBeyondLoopbackTLSAndRoles(t *testing.T) {
	t.Parallel()
	ip := nonLoopbackIPv4(t)
	if os.Geteuid() != 0 {
		skipOrFailUnderCI(t, "the checks as another OS user need root")
	}
	psql, err := exec.LookPath("psql")
	if err != nil {
		skipOrFailUnderCI(t, "psql is not installed (Debian: postgresql-client)")
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx := context.Background()
	dataDir := tempDataDir(t)
	pg, pool, opts := startDedicatedPostgres(t, dataDir, true, func(o *managedPostgresOptions) { o.Listen = addr })
	registerApps(t, pool, "org.telegram.messenger")
	pool.Close()

	certPath := filepath.Join(opts.DataDir, pgTLSCertFile)
	checkTLSFiles(t, opts.DataDir, ip)
	firstCert, err := os.ReadFile(certPath)
	if err != nil {
		t.Fatal(err)
	}
	// A copy nobody may read, to check the certificate with verify-full.
	rootCert := filepath.Join(tempDataDir(t), "root.crt")
	if err := os.WriteFile(rootCert, firstCert, 0o644); err != nil {
		t.Fatal(err)
	}
	pw := mustPasswords(t, opts.DataDir)
	const whoAndTLS = `SELECT current_user || ' ' || ssl || ' ' || (SELECT count(*) FROM apps_registry_application) FROM pg_stat_ssl WHERE pid = pg_backend_pid()`
	type attempt struct {
		role, sslmode, rootCert string
		want                    string // psql's output; empty: refused
	}
	try := func(start string, cases []attempt) {
		t.Helper()
		for _, c := range cases {
			out, err := psqlAsNobody(t, psql, addr, c.role, pw[c.role], c.sslmode, c.rootCert, whoAndTLS)
			switch {
			case c.want == "" && err == nil:
				t.Errorf("%s: as nobody, %s with sslmode=%s over %s got in: %s", start, c.role, c.sslmode, addr, out)
			case c.want == "" && !strings.Contains(out, "no pg_hba.conf entry"):
				t.Errorf("%s: %s with sslmode=%s refused for another reason than pg_hba.conf: %s", start, c.role, c.sslmode, out)
			case c.want != "" && (err != nil || out != c.want):
				t.Errorf("%s: as nobody, %s with sslmode=%s: %q, %v; want %q", start, c.role, c.sslmode, out, err, c.want)
			}
		}
	}
	try("without PLAYWATCH_PG_WRITER_FROM", []attempt{
		{pgWriterRole, "require", "", ""},
		{pgWriterRole, "disable", "", ""},
		{pgReaderRole, "disable", "", ""},
		{pgReaderRole, "require", "", pgReaderRole + " true 1"},
		{pgReaderRole, "verify-full", rootCert, pgReaderRole + " true 1"},
	})

	// db-url gives URLs with sslmode=require: the reader's works from here
	// (a non-loopback address), the writer's is refused, and db-url says why.
	// db-url serves the cluster of a running playwatch: this test passes
	// for one, as `run` would publish it.
	passForRunning(t, dataDir, pg.DSN(), addr)
	env := map[string]string{"PLAYWATCH_DATA_DIR": dataDir, "DATABASE_URL": ""}
	for _, reader := range []bool{true, false} {
		args := []string{"db-url"}
		if reader {
			args = append(args, "--reader")
		}
		var out, errOut syncBuffer
		if err := run(ctx, args, envFunc(env), &out, &errOut); err != nil {
			t.Fatalf("playwatch %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
		}
		dsn := strings.TrimSpace(out.String())
		if !strings.Contains(dsn, "@"+addr+"/") || !strings.Contains(dsn, "sslmode=require") {
			t.Errorf("playwatch %s printed %q, want a URL of %s with sslmode=require", strings.Join(args, " "), dsn, addr)
		}
		err := connectErr(dsn, "SELECT count(*) FROM reviews")
		if reader && err != nil {
			t.Errorf("the URL of playwatch db-url --reader: %v", err)
		}
		if !reader && (err == nil || !strings.Contains(errOut.String(), "PLAYWATCH_PG_WRITER_FROM")) {
			t.Errorf("the writer's URL over %s: %v (stderr %q), want refused and db-url naming PLAYWATCH_PG_WRITER_FROM", addr, err, errOut.String())
		}
	}
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	opts.WriterFrom = []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr(ip), 24).Masked()}
	pg = startTestManagedPostgres(t, opts, testLogger(t))
	try("with PLAYWATCH_PG_WRITER_FROM="+opts.WriterFrom[0].String(), []attempt{
		{pgWriterRole, "require", "", pgWriterRole + " true 1"},
		{pgWriterRole, "disable", "", ""},
		{pgReaderRole, "disable", "", ""},
		{pgReaderRole, "require", "", pgReaderRole + " true 1"},
	})
	if again, err := os.ReadFile(certPath); err != nil || !bytes.Equal(again, firstCert) {
		t.Errorf("the second start did not reuse the certificate (%v)", err)
	}
	// Now that the writer may come from other hosts, db-url's writer URL
	// works from here and db-url no longer says that it does not.
	if _, err := publishRunning(dataDir, runningPlaywatch{PID: os.Getpid(), Version: version, DatabaseURL: pg.DSN(), Brokers: []string{"127.0.0.1:9"},
		PGListen: addr, PGWriterFrom: true, ManagedPostgres: true}); err != nil {
		t.Fatal(err)
	}
	var out, errOut syncBuffer
	if err := run(ctx, []string{"db-url"}, envFunc(env), &out, &errOut); err != nil {
		t.Fatalf("playwatch db-url: %v\n%s", err, errOut.String())
	}
	if err := connectErr(strings.TrimSpace(out.String()), "SELECT count(*) FROM reviews"); err != nil || strings.Contains(errOut.String(), "PLAYWATCH_PG_WRITER_FROM") {
		t.Errorf("the writer's URL with PLAYWATCH_PG_WRITER_FROM: %v (stderr %q), want it to work and no note", err, errOut.String())
	}
}

// checkTLSFiles checks the certificate and key in pgData: files of the
// postgres OS user with mode 0600, an ECDSA P-256 key, the address ip and
// the host name among the certificate's names.
func checkTLSFiles(t *testing.T, pgData, ip string) {
	t.Helper()
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{pgTLSCertFile, pgTLSKeyFile} {
		fi, err := os.Lstat(filepath.Join(pgData, name))
		if err != nil {
			t.Fatal(err)
		}
		if owner := strconv.Itoa(int(fi.Sys().(*syscall.Stat_t).Uid)); fi.Mode() != 0o600 || owner != u.Uid {
			t.Errorf("%s: mode %v, owner uid %s; want 0600 of postgres (uid %s)", name, fi.Mode(), owner, u.Uid)
		}
	}
	cert := readCert(t, filepath.Join(pgData, pgTLSCertFile))
	if k, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("the certificate's key is %T, want ECDSA P-256", cert.PublicKey)
	}
	host, _ := os.Hostname()
	if !slices.ContainsFunc(cert.IPAddresses, func(a net.IP) bool { return a.String() == ip }) || !slices.Contains(cert.DNSNames, host) {
		t.Errorf("the certificate names %v %v, want %s and %s", cert.IPAddresses, cert.DNSNames, ip, host)
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s holds no PEM block", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// The certificate is kept while it is good for the listen address and
// replaced when it is missing, its key is, it expires within a month, it
// names another address, or what lies there is not a private regular file
// (a symbolic link is replaced, never followed).
func TestManagedPostgresTLSCertificateRenewal(t *testing.T) {
	dir := t.TempDir()
	m := &managedPostgres{opts: managedPostgresOptions{DataDir: dir, Listen: "192.0.2.10:5432"}, logger: testLogger(t)}
	certPath, keyPath := filepath.Join(dir, pgTLSCertFile), filepath.Join(dir, pgTLSKeyFile)
	ensure := func() []byte {
		t.Helper()
		c, k, err := m.ensureTLSFiles(nil)
		if err != nil || c != certPath || k != keyPath {
			t.Fatalf("ensureTLSFiles: %s %s %v", c, k, err)
		}
		b, err := os.ReadFile(certPath)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	first := ensure()
	if !bytes.Equal(ensure(), first) {
		t.Fatal("a good certificate was replaced")
	}
	if cert := readCert(t, certPath); cert.NotAfter.Before(time.Now().Add(365 * 24 * time.Hour)) {
		t.Errorf("the certificate expires at %s already", cert.NotAfter)
	}

	current := first
	renewed := func(what string, spoil func()) {
		t.Helper()
		spoil()
		got := ensure()
		if bytes.Equal(got, current) {
			t.Errorf("%s: the certificate was kept", what)
		}
		_, _, names := pgTLSNames(m.opts.Listen)
		if why, err := reusableTLSFiles(certPath, keyPath, nil, names, time.Now()); why != "" || err != nil {
			t.Errorf("%s: the new files are not usable: %s %v", what, why, err)
		}
		current = got
	}
	renewed("key missing", func() { os.Remove(keyPath) })
	renewed("certificate missing", func() { os.Remove(certPath) })
	renewed("expiring", func() {
		dns, ips, _ := pgTLSNames(m.opts.Listen)
		old, oldKey, err := newSelfSignedCert(dns, ips, time.Now().Add(-pgTLSValidity+24*time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		writeFileAtomic(certPath, old, 0o600, nil)
		writeFileAtomic(keyPath, oldKey, 0o600, nil)
	})
	renewed("a key of another certificate", func() {
		_, otherKey, err := newSelfSignedCert(nil, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		writeFileAtomic(keyPath, otherKey, 0o600, nil)
	})
	renewed("mode 0644", func() { os.Chmod(keyPath, 0o644) })
	renewed("a FIFO", func() {
		os.Remove(keyPath)
		if err := syscall.Mkfifo(keyPath, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	elsewhere := filepath.Join(t.TempDir(), "elsewhere.key")
	renewed("a symbolic link", func() {
		b, _ := os.ReadFile(keyPath)
		os.WriteFile(elsewhere, b, 0o600)
		os.Remove(keyPath)
		os.Symlink(elsewhere, keyPath)
	})
	if fi, err := os.Lstat(keyPath); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the key is still a symbolic link: %v %v", fi, err)
	}
	m.opts.Listen = "198.51.100.3:5432"
	renewed("another listen address", func() {})
	if cert := readCert(t, certPath); len(cert.IPAddresses) != 1 || cert.IPAddresses[0].String() != "198.51.100.3" {
		t.Errorf("the certificate for 198.51.100.3 names %v", cert.IPAddresses)
	}
}

// The server's OS user owns the data directory and may swap a FIFO in for
// the key at any moment, also between a look at the file and its read:
// the check opens without waiting for a writer and checks what it opened,
// so it never blocks.
func TestManagedPostgresTLSFIFOSwappedInNeverBlocks(t *testing.T) {
	dir := t.TempDir()
	m := &managedPostgres{opts: managedPostgresOptions{DataDir: dir, Listen: "192.0.2.10:5432"}, logger: slog.New(slog.DiscardHandler)}
	certPath, keyPath := filepath.Join(dir, pgTLSCertFile), filepath.Join(dir, pgTLSKeyFile)
	if _, _, err := m.ensureTLSFiles(nil); err != nil {
		t.Fatal(err)
	}
	good, fifo := filepath.Join(dir, "good"), filepath.Join(dir, "fifo")
	if err := os.Link(keyPath, good); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// The swapper puts the good key and the FIFO in turn in the key's place.
	stop := make(chan struct{})
	swapped := make(chan struct{})
	go func() {
		defer close(swapped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// rename(2) leaves next alone when it is a link of keyPath's file.
			next, src := filepath.Join(dir, "next"), []string{good, fifo}[i%2]
			os.Remove(next)
			if os.Link(src, next) == nil {
				os.Rename(next, keyPath)
			}
		}
	}()
	defer func() { close(stop); <-swapped }()
	_, _, names := pgTLSNames(m.opts.Listen)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
			reusableTLSFiles(certPath, keyPath, nil, names, time.Now())
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the TLS files check blocks on a FIFO swapped in for the key")
	}
}

// A certificate or key that cannot be read (EACCES here) fails the start
// instead of being made again, which would hide the fault and change the
// certificate that clients pinned. Root reads any file, so as root the
// test runs itself as the OS user nobody.
func TestManagedPostgresTLSUnreadableFileIsAnError(t *testing.T) {
	if os.Geteuid() == 0 {
		runTestAsNobody(t, "TestManagedPostgresTLSUnreadableFileIsAnError")
		return
	}
	dir := t.TempDir()
	m := &managedPostgres{opts: managedPostgresOptions{DataDir: dir, Listen: "192.0.2.10:5432"}, logger: testLogger(t)}
	certPath, keyPath := filepath.Join(dir, pgTLSCertFile), filepath.Join(dir, pgTLSKeyFile)
	if _, _, err := m.ensureTLSFiles(nil); err != nil {
		t.Fatal(err)
	}
	cert, err := os.ReadFile(certPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(keyPath, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.ensureTLSFiles(nil); !errors.Is(err, fs.ErrPermission) {
		t.Fatalf("ensureTLSFiles with an unreadable key: %v, want a permission error", err)
	}
	if now, err := os.ReadFile(certPath); err != nil || !bytes.Equal(now, cert) {
		t.Errorf("the certificate was made again (%v)", err)
	}
}

// runTestAsNobody runs the test name of a copy of this test binary as the
// OS user nobody, and fails t when it does not pass.
func runTestAsNobody(t *testing.T, name string) {
	t.Helper()
	if _, err := exec.LookPath("su"); err != nil {
		skipOrFailUnderCI(t, "no su to run the test as nobody")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	// go test's build directory and t.TempDir are root's alone.
	dir, err := os.MkdirTemp("", "pwnobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	copied := filepath.Join(dir, "playwatch.test")
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copied, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("su", "nobody", "-s", "/bin/sh", "-c", "exec "+copied+" -test.count=1 -test.v -test.run '^"+name+"$'")
	cmd.SysProcAttr = childProcAttr(false)
	cmd.Env = append(os.Environ(), "TMPDIR=/tmp")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+name) {
		t.Fatalf("%s as nobody: %v\n%s", name, err, out)
	}
}
