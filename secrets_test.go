package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// testSecret is the password or token of the cases below; no output may
// hold it, escaped or not.
const testSecret = "S3cretXyz"

func checkNoSecret(t *testing.T, what, output string) {
	t.Helper()
	for _, s := range []string{testSecret, url.QueryEscape(testSecret + "/@"), strings.ToLower(testSecret)} {
		if strings.Contains(output, s) {
			t.Errorf("%s shows the secret %q:\n%s", what, s, output)
		}
	}
}

// Every secret setting, wrong in several ways: playwatch starts (through
// run, as main does) and fails, and nothing it prints, logs or returns shows
// the secret; a URL shows as user:xxxxx@.
func TestSecretsNeverShown(t *testing.T) {
	t.Parallel()
	pwFile := filepath.Join(t.TempDir(), "sasl-password")
	if err := os.WriteFile(pwFile, []byte(testSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dbURL := newTestDatabase(t)
	db := func(u string) map[string]string { return map[string]string{"DATABASE_URL": u} }
	sasl := func(mech string, more map[string]string) map[string]string {
		env := map[string]string{"KAFKA_SASL_MECHANISM": mech, "KAFKA_SASL_USERNAME": "alice", "KAFKA_SASL_PASSWORD": testSecret}
		for k, v := range more {
			env[k] = v
		}
		return env
	}
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		// shows is what the output must say instead (empty: anything).
		shows string
	}{
		{"DATABASE_URL scheme typo", db("postgress://writer:" + testSecret + "@127.0.0.1:5432/playwatch"), nil, `DATABASE_URL="postgress://writer:xxxxx@127.0.0.1:5432/playwatch"`},
		{"DATABASE_URL without a scheme", db("writer:" + testSecret + "@127.0.0.1:5432/playwatch"), nil, "DATABASE_URL"},
		{"DATABASE_URL as key=value", db("host=127.0.0.1 user=writer password=" + testSecret), nil, "password=xxxxx"},
		{"DATABASE_URL port out of range", db("postgres://writer:" + testSecret + "@127.0.0.1:99999/playwatch"), nil, "DATABASE_URL"},
		{"DATABASE_URL port not a number", db("postgres://writer:" + testSecret + "@127.0.0.1:pg/playwatch"), nil, "DATABASE_URL"},
		{"DATABASE_URL slash in the password", db("postgres://writer:" + testSecret + "/Q@127.0.0.1/playwatch"), nil, "DATABASE_URL"},
		{"DATABASE_URL at sign in the password", db("postgres://writer:" + testSecret + "@Q@127.0.0.1:1/playwatch"), nil, ""},
		{"DATABASE_URL escaped password", db("postgres://writer:" + url.QueryEscape(testSecret+"/@") + "@127.0.0.1:1/playwatch"), nil, "connect"},
		{"DATABASE_URL unreachable host", db("postgres://writer:" + testSecret + "@127.0.0.1:1/playwatch?connect_timeout=2"), nil, "connect"},
		{"DATABASE_URL unknown host", db("postgres://writer:" + testSecret + "@nosuchhost.invalid/playwatch?connect_timeout=2"), nil, ""},
		{"DATABASE_URL bad query", db("postgres://writer:" + testSecret + "@127.0.0.1/playwatch?sslmode=bogus"), nil, "DATABASE_URL"},
		{"DATABASE_URL password in the query", db("postgres://writer@127.0.0.1:1/playwatch?sslmode=bogus&password=" + testSecret), nil, "password=xxxxx"},
		{"DATABASE_URL sslpassword in the query", db("postgres://writer@127.0.0.1:1/playwatch?sslpassword=" + testSecret + "&sslmode=bogus"), nil, ""},
		{"DATABASE_URL password query without a scheme", db("writer@127.0.0.1/playwatch?password=" + testSecret), nil, "password=xxxxx"},
		{"--database-url scheme typo", nil, []string{"--database-url", "postgress://writer:" + testSecret + "@db.example/playwatch"}, "writer:xxxxx@"},
		{"--database-url= unreachable", nil, []string{"--database-url=postgres://writer:" + testSecret + "@127.0.0.1:1/playwatch"}, "connect"},
		{"PROXIES bad scheme", map[string]string{"PROXIES": "ftp://u:" + testSecret + "@proxy.example:21"}, nil, "PROXIES"},
		{"PROXIES bad port", map[string]string{"PROXIES": "http://ok.example:3128,http://u:" + testSecret + "@proxy.example:port"}, nil, "PROXIES"},
		{"PROXIES no host", map[string]string{"PROXIES": "http://u:" + testSecret + "@"}, nil, "PROXIES"},
		{"PROXIES a space in the password", map[string]string{"PROXIES": "http://u:" + testSecret + " x@proxy.example:3128"}, nil, "PROXIES"},
		{"PLAYSTORE_URL bad scheme", map[string]string{"PLAYSTORE_URL": "ftp://u:" + testSecret + "@play.example"}, nil, "PLAYSTORE_URL"},
		{"PLAYSTORE_URL bad port", map[string]string{"PLAYSTORE_URL": "https://u:" + testSecret + "@play.example:x"}, nil, "PLAYSTORE_URL"},
		{"REGISTRY_TOKEN beside a wrong setting", map[string]string{"REGISTRY_TOKEN": testSecret, "KAFKA_TOPIC_PARTITIONS": "-3"}, nil, "KAFKA_TOPIC_PARTITIONS"},
		{"--registry-token beside a wrong flag", nil, []string{"--registry-token", testSecret, "--http-addr", "nowhere"}, "PLAYWATCH_HTTP_ADDR"},
		{"REGISTRY_TOKEN on a database that fails", map[string]string{"REGISTRY_TOKEN": testSecret, "DATABASE_URL": "postgres://writer@127.0.0.1:1/playwatch"}, nil, ""},
		{"STATUS_PAGE_TOKEN beside a wrong setting", map[string]string{"STATUS_PAGE_TOKEN": testSecret, "LOG_FORMAT": "xml"}, nil, "LOG_FORMAT"},
		{"--status-page-token= beside a wrong flag", nil, []string{"--status-page-token=" + testSecret, "--roles", "chef"}, "--roles"},
		{"KAFKA_SASL_PASSWORD without a mechanism", map[string]string{"KAFKA_SASL_USERNAME": "alice", "KAFKA_SASL_PASSWORD": testSecret}, nil, "KAFKA_SASL_MECHANISM"},
		{"KAFKA_SASL_PASSWORD with a wrong mechanism", sasl("SCRAM", nil), nil, "KAFKA_SASL_MECHANISM"},
		{"KAFKA_SASL_PASSWORD PLAIN without TLS", sasl("PLAIN", nil), nil, "KAFKA_TLS"},
		{"KAFKA_SASL_PASSWORD on the embedded broker", sasl("SCRAM-SHA-256", map[string]string{"DATABASE_URL": dbURL}), nil, "KAFKA_BROKERS"},
		{"KAFKA_SASL_PASSWORD unreachable brokers", sasl("SCRAM-SHA-512", map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": "127.0.0.1:1"}), nil, ""},
		{"KAFKA_SASL_PASSWORD and its file", sasl("SCRAM-SHA-512", map[string]string{"KAFKA_SASL_PASSWORD_FILE": pwFile}), nil, "KAFKA_SASL_PASSWORD_FILE"},
		{"KAFKA_SASL_PASSWORD_FILE without a mechanism", map[string]string{"KAFKA_SASL_USERNAME": "alice", "KAFKA_SASL_PASSWORD_FILE": pwFile}, nil, "KAFKA_SASL_MECHANISM"},
		{"KAFKA_SASL_PASSWORD_FILE unreachable brokers", sasl("SCRAM-SHA-256", map[string]string{"KAFKA_SASL_PASSWORD": "", "KAFKA_SASL_PASSWORD_FILE": pwFile,
			"DATABASE_URL": dbURL, "KAFKA_BROKERS": "127.0.0.1:1"}), nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"PLAYWATCH_DATA_DIR": filepath.Join(t.TempDir(), "data"), "PLAYWATCH_HTTP_ADDR": freeAddr(t),
				"PLAYWATCH_BROKER_ADDR": freeAddr(t), "LOG_LEVEL": "debug"}
			for k, v := range c.env {
				env[k] = v
			}
			// What never ends on its own (brokers that do not answer) is cut
			// short: its output until then counts.
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
			defer cancel()
			var stdout, stderr syncBuffer
			err := run(ctx, append([]string{"run", "--roles", "registry"}, c.args...), envFunc(env), &stdout, &stderr)
			if err == nil {
				t.Fatalf("run succeeded:\n%s", stderr.String())
			}
			exitStatus(err, &stderr) // what main prints
			out := stdout.String() + stderr.String()
			checkNoSecret(t, "the output", out)
			if !strings.Contains(out, c.shows) {
				t.Errorf("the output does not say %q:\n%s", c.shows, out)
			}
		})
	}
}

// A running appliance with a password in DATABASE_URL and both tokens set:
// its logs, /readyz and the one-off commands beside it show none of them.
func TestSecretsNeverShownWhileRunning(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(newTestDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), testSecret) // the test cluster trusts its socket
	env := map[string]string{"PLAYWATCH_DATA_DIR": filepath.Join(tempDataDir(t), "data"), "PLAYWATCH_HTTP_ADDR": freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t), "LOG_LEVEL": "debug", "DATABASE_URL": u.String(),
		"REGISTRY_TOKEN": testSecret + "R", "STATUS_PAGE_TOKEN": testSecret + "S"}
	base, stop, logs := startRun(t, env, "--roles", "registry")
	code, body := httpDo(t, "GET", base+"/readyz", "")
	checkNoSecret(t, "/readyz", body)
	if code != 200 {
		t.Errorf("/readyz: %d %s", code, body)
	}
	// One-off commands: attached to it, or with the DATABASE_URL.
	for _, args := range [][]string{{"migrate"}, {"dlq", "list"}, {"sentiment", "rescore", "--all"}} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, envFunc(env), &out, &errOut)
		exitStatus(err, &errOut)
		checkNoSecret(t, strings.Join(args, " "), out.String()+errOut.String())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkNoSecret(t, "the logs", logs.String())
	if !strings.Contains(logs.String(), "playwatch ready") {
		t.Errorf("no logs:\n%s", logs.String())
	}
}

// maskPasswords masks what stands as a password, and nothing else.
func TestMaskPasswords(t *testing.T) {
	checkStringFunc(t, "maskPasswords", maskPasswords, map[string]string{
		"postgres://writer:pw@db:5432/x":             "postgres://writer:xxxxx@db:5432/x",
		`parse "postgres://w:p@h:x/d": invalid port`: `parse "postgres://w:xxxxx@h:x/d": invalid port`,
		"database=postgres://w:pw@h/d brokers=[a:1]": "database=postgres://w:xxxxx@h/d brokers=[a:1]",
		"w:pw@h:5432/d": "w:xxxxx@h:5432/d",
		"postgres://w@h/d?sslmode=require&password=pw&x=1":      "postgres://w@h/d?sslmode=require&password=xxxxx&x=1",
		"host=h password='p w' sslpassword=q":                   "host=h password=xxxxx sslpassword=xxxxx",
		"http://u:p@proxy:3128,https://v:q@proxy2":              "http://u:xxxxx@proxy:3128,https://v:xxxxx@proxy2",
		"postgres://w@h/d":                                      "postgres://w@h/d",
		"listening on 127.0.0.1:8080 at 12:00:01, mail a@b.com": "listening on 127.0.0.1:8080 at 12:00:01, mail a@b.com",
		"invalid KAFKA_SASL_PASSWORD=(not shown)":               "invalid KAFKA_SASL_PASSWORD=(not shown)",
	})
}

// /readyz through the redaction run wraps its checks in: a failing check
// still says why without its password, and a note keeps /readyz at 200.
func TestReadyzRedactedChecks(t *testing.T) {
	cfg := Config{secrets: []string{testSecret}}
	checks := []readinessCheck{
		{"note", func(context.Context) error { return readinessNote("ok; partitions reset") }},
	}
	redactChecks(cfg, checks)
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), nil, nil, checks, testLogger(t)))
	defer srv.Close()
	if code, body, _ := getPage(t, srv.URL+"/readyz"); code != http.StatusOK || !strings.Contains(body, "partitions reset") {
		t.Errorf("a redacted note: %d %s, want 200 with the note", code, body)
	}
	checks = append(checks, readinessCheck{"database", func(context.Context) error {
		return errors.New("dial postgres://writer:" + testSecret + "@db:5432/x: refused")
	}})
	redactChecks(cfg, checks[1:])
	srv.Config.Handler = newHTTPHandler(reg, newHTTPMetrics(prometheus.NewRegistry()), nil, nil, checks, testLogger(t))
	code, body, _ := getPage(t, srv.URL+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "refused") {
		t.Errorf("a failing check: %d %s, want 503 saying why", code, body)
	}
	checkNoSecret(t, "/readyz", body)
}

// A crawl's error text, which is stored and shown on the status page and by
// the API, is masked as every other message is: also a proxy's user info
// without a scheme or with a slash in its password, and password=.
func TestCrawlOutcomeErrorMasked(t *testing.T) {
	for _, text := range []string{
		`proxyconnect tcp: dial http://u:` + testSecret + `@proxy.example:3128: refused`,
		`proxy u:` + testSecret + `@proxy.example:3128 refused the tunnel`,
		`Get "https://play.example/store": proxy http://u:` + testSecret + `/x@proxy.example:3128: refused`,
		`socks connect tcp u:` + testSecret + `@10.0.0.1:1080->play.google.com:443: refused`,
		`Get "https://play.example/store?password=` + testSecret + `": timeout`,
	} {
		o := crawlOutcomeOf(context.Background(), errors.New(text))
		checkNoSecret(t, "the outcome of "+text, o.Error)
		if !strings.Contains(o.Error, "xxxxx") {
			t.Errorf("the outcome of %q: %q masks nothing", text, o.Error)
		}
	}
}

// The secrets run redacts a command's error with include the password
// KAFKA_SASL_PASSWORD_FILE holds, named by the environment or a flag.
func TestCommandSecretsPasswordFile(t *testing.T) {
	pwFile := filepath.Join(t.TempDir(), "sasl-password")
	if err := os.WriteFile(pwFile, []byte(testSecret+"\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	text := "SASL authentication of alice with " + testSecret + " failed"
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"environment", []string{"run"}, map[string]string{"KAFKA_SASL_PASSWORD_FILE": pwFile}},
		{"flag", []string{"run", "--kafka-sasl-password-file", pwFile}, nil},
		{"flag=", []string{"run", "--kafka-sasl-password-file=" + pwFile}, nil},
	} {
		checkNoSecret(t, c.name, commandSecrets(c.args, envFunc(c.env)).redact(text))
	}
	// A file that cannot be read adds nothing, and fails nothing.
	got := commandSecrets([]string{"run"}, envFunc(map[string]string{"KAFKA_SASL_PASSWORD_FILE": pwFile + ".missing"})).redact(text)
	if got != text {
		t.Errorf("with an unreadable file: %q", got)
	}
}

// A panic of a handler is logged on the logger run gives the HTTP handler,
// which redacts, also when neither the registry nor the status page runs
// (before, such a server logged on slog's unredacted default).
func TestHTTPHandlerPanicLogRedacted(t *testing.T) {
	var logs syncBuffer
	logger := newLogger(Config{secrets: []string{testSecret}}, &logs)
	checks := []readinessCheck{{"database", func(context.Context) error {
		panic("dial postgres://writer:" + testSecret + "@db:5432/x with token " + testSecret)
	}}}
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(newHTTPHandler(reg, newHTTPMetrics(reg), nil, nil, checks, logger))
	defer srv.Close()
	if code, body := httpDo(t, "GET", srv.URL+"/readyz", ""); code != http.StatusInternalServerError {
		t.Errorf("/readyz that panics: %d %s", code, body)
	}
	if !strings.Contains(logs.String(), "HTTP handler panicked") || !strings.Contains(logs.String(), "writer:xxxxx@db") {
		t.Errorf("the panic is not logged on the given logger:\n%s", logs.String())
	}
	checkNoSecret(t, "the log", logs.String())
}

// The redaction every log attribute goes through, on a line that holds
// nothing to hide (the usual case) and on one that does.
func BenchmarkRedact(b *testing.B) {
	cfg := Config{secrets: []string{testSecret, "another-token-value"}}
	for _, tc := range []struct{ name, s string }{
		{"clean", "crawl cycle finished cycle=12 apps=40 took=1m3.2s"},
		{"url", "dial postgres://writer:" + testSecret + "@db:5432/x?sslmode=require: refused"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				_ = cfg.redact(tc.s)
			}
		})
	}
}
