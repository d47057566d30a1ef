package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestDemo is `make demo`: the whole pipeline offline, for a newcomer. The
// appliance runs in a temporary directory against the replay Play Store
// (built from testdata/playstore), three apps are registered through the
// API, one crawl cycle and one capture analysis run, and what landed in
// PostgreSQL is printed. The recorded times are moved so that each app's
// newest is just now (its reviews are of the last hours, as with a store
// crawled today). PLAYWATCH_HTTP_ADDR and PLAYWATCH_BROKER_ADDR, when set,
// say where the appliance listens (else on free loopback ports), with
// REGISTRY_TOKEN, which an address beyond loopback needs. It runs only with
// PLAYWATCH_DEMO=1 and leaves nothing behind.
func TestDemo(t *testing.T) {
	if os.Getenv("PLAYWATCH_DEMO") != "1" {
		t.Skip("the offline demo runs with PLAYWATCH_DEMO=1 (make demo)")
	}
	out := os.Stdout
	replay := newReplayPlayStore(t)
	replay.shiftTimesTo(time.Now())
	// Apps with recorded pages, each served its own listing; Google
	// Translate's reviews are recorded too, the others' are made up in the
	// recorded layout.
	apps := []struct{ pkg, title, body string }{
		{"com.google.android.apps.translate", "Google Translate", `{"package_name":"com.google.android.apps.translate"}`},
		{"com.mojang.minecraftpe", "Minecraft: Dream it, Build it!", `{"package_name":"com.mojang.minecraftpe"}`},
		{"com.adex77.WhereAmI", "Where Am I? - GeoGuess Game", `{"package_name":"com.adex77.WhereAmI"}`},
	}
	for _, app := range apps {
		page := readPlaystoreFixture(t, "details_"+app.pkg+"_en_us.html")
		replay.setApp(app.pkg, replayApp{DetailsPage: page, Reviews: 30})
	}
	replay.useFixtureReviews(apps[0].pkg)
	dir := tempDataDir(t)
	env := map[string]string{
		"PLAYWATCH_DATA_DIR":    filepath.Join(dir, "data"),
		"PLAYWATCH_HTTP_ADDR":   demoAddr(t, "PLAYWATCH_HTTP_ADDR"),
		"PLAYWATCH_BROKER_ADDR": demoAddr(t, "PLAYWATCH_BROKER_ADDR"),
		"PLAYSTORE_URL":         replay.URL,
		"RATE_LIMIT_REQUESTS":   "0",
		"EGRESS_MIN_GAP":        "0s",
		"REVIEWS_PER_APP":       "50",
		"REGISTRY_TOKEN":        os.Getenv("REGISTRY_TOKEN"),
	}
	auth := ""
	if env["REGISTRY_TOKEN"] != "" {
		auth = ` -H "Authorization: Bearer $REGISTRY_TOKEN"`
	}
	fmt.Fprintf(out, "playwatch demo: the whole pipeline offline.\nThe Play Store is a replay of recorded pages on %s; the data directory is %s.\n\n",
		replay.URL, env["PLAYWATCH_DATA_DIR"])

	start := time.Now()
	fmt.Fprintln(out, "$ playwatch run --roles registry,consumer,sentiment    # its own PostgreSQL and Kafka-protocol broker, as with no configuration;")
	fmt.Fprintln(out, "                                                      # no crawler role: the crawl cycle below is a one-off")
	// Without the crawler role no scheduler leads, so that crawl --once
	// may plan the cycle (it refuses beside a leader).
	a := startE2EAppliance(t, env, "--roles", "registry,consumer,sentiment")
	a.base = "http://" + reachable(env["PLAYWATCH_HTTP_ADDR"])
	fmt.Fprintf(out, "  ready in %s: registry API and /metrics on %s, broker on %s\n\n", time.Since(start).Round(100*time.Millisecond), a.base, a.brokers[0])

	for _, app := range apps {
		fmt.Fprintf(out, "$ curl -s -X POST%s %s/api/v1/apps -d '%s'\n", auth, a.base, app.body)
		code, body := demoRegister(t, a.base, env["REGISTRY_TOKEN"], app.body)
		if code != http.StatusCreated {
			t.Fatalf("register %s: %d %s", app.pkg, code, body)
		}
		fmt.Fprintf(out, "  %s\n", strings.TrimSpace(body))
	}

	fmt.Fprintln(out, "\n$ playwatch crawl --once    # beside the running appliance: uses its database and broker, plans one cycle and crawls it")
	fmt.Fprint(out, indent(a.command("crawl", "--once")))
	capture := filepath.Join("testdata", "pcap", "clean_upload.pcap")
	fmt.Fprintf(out, "\n$ playwatch pcap --app %s --scenario UPLOAD %s\n", apps[0].pkg, capture)
	fmt.Fprint(out, indent(a.command("pcap", "--app", apps[0].pkg, "--scenario", "UPLOAD", capture)))

	drain := time.Now()
	a.waitDrained()
	fmt.Fprintf(out, "\nThe storage consumer stored every message within %s. What landed in PostgreSQL:\n\n", time.Since(drain).Round(10*time.Millisecond))
	printQuery(t, out, a.pool, `SELECT 'apps_registry_application' AS "table", count(*) AS rows FROM apps_registry_application
		UNION ALL SELECT 'app_stats', count(*) FROM app_stats
		UNION ALL SELECT 'reviews', count(*) FROM reviews
		UNION ALL SELECT 'network_metrics', count(*) FROM network_metrics
		UNION ALL SELECT 'dead_letter_events', count(*) FROM dead_letter_events`)
	// Each app has its own listing: its own title, and no two alike.
	listings := map[string]bool{}
	for _, app := range apps {
		var title, listing string
		if err := a.pool.QueryRow(context.Background(), `SELECT a.display_name, concat_ws(' ', s.min_installs, s.score, s.ratings, s.version)
			FROM apps_registry_application a JOIN app_stats s ON s.application_id = a.id WHERE a.package_name = $1`, app.pkg).Scan(&title, &listing); err != nil {
			t.Fatalf("%s: %v", app.pkg, err)
		}
		if title != app.title || listings[listing] {
			t.Errorf("%s: title %q, listing %q; want %q and a listing of its own", app.pkg, title, listing, app.title)
		}
		listings[listing] = true
	}
	fmt.Fprintln(out, "\napps_registry_application (display names and categories filled from the store):")
	printQuery(t, out, a.pool, `SELECT package_name, display_name, category, is_messaging_app, is_iranian_app FROM apps_registry_application ORDER BY id`)
	fmt.Fprintln(out, "\napp_stats:")
	printQuery(t, out, a.pool, `SELECT a.package_name, s.min_installs, s.score, s.ratings, s.version, s.crawled_at
		FROM app_stats s JOIN apps_registry_application a ON a.id = s.application_id ORDER BY s.id`)
	fmt.Fprintln(out, "\nreviews per app, as the status page counts them:")
	printQuery(t, out, a.pool, `SELECT a.package_name, count(r.id) FILTER (WHERE r.at > now() - interval '24 hours') AS "last 24 h", count(r.id) AS "all"
		FROM apps_registry_application a LEFT JOIN reviews r ON r.application_id = a.id GROUP BY a.id ORDER BY a.id`)
	// The overview's "Reviews, 24 h" of every app: months-old recorded
	// reviews made it 0 everywhere.
	code, page := httpDo(t, http.MethodGet, a.base+"/", "")
	if code != http.StatusOK {
		t.Fatalf("GET /: %d %s", code, page)
	}
	cells := reviews24hCell.FindAllStringSubmatch(page, -1)
	if len(cells) != len(apps) {
		t.Errorf("the overview has %d \"Reviews, 24 h\" cells, want one per app (%d)", len(cells), len(apps))
	}
	for _, c := range cells {
		if c[1] == "0" {
			t.Errorf("the overview shows an app with 0 reviews in the last 24 h: %s", c[0])
		}
	}
	fmt.Fprintln(out, "\nreviews (the newest two of each app):")
	printQuery(t, out, a.pool, `SELECT package_name, score, user_name, content, at FROM (
		SELECT a.package_name, r.score, r.user_name, replace(r.content, E'\n', ' ') AS content, r.at,
			row_number() OVER (PARTITION BY r.application_id ORDER BY r.at DESC) AS n
		FROM reviews r JOIN apps_registry_application a ON a.id = r.application_id) newest WHERE n <= 2 ORDER BY package_name, at DESC`)
	fmt.Fprintln(out, "\nnetwork_metrics:")
	printQuery(t, out, a.pool, `SELECT a.package_name, m.scenario, round(m.rtt_handshake::numeric, 3)::text AS rtt_ms, m.retransmission_count,
		m.bytes_transferred_total, round(m.overhead_ratio::numeric, 4)::text AS overhead_ratio, m.source_pcap_filename
		FROM network_metrics m JOIN apps_registry_application a ON a.id = m.application_id`)

	fmt.Fprintf(out, "\n$ curl -s %s/metrics | grep -E '^playwatch_consumer_(records|rows_written)_total'\n", a.base)
	for line := range strings.Lines(metricsText(t, a.base)) {
		if strings.HasPrefix(line, "playwatch_consumer_records_total") || strings.HasPrefix(line, "playwatch_consumer_rows_written_total") {
			fmt.Fprint(out, "  "+line)
		}
	}
	status := a.base + "/"
	if os.Getenv("PLAYWATCH_DEMO_WAIT") == "1" {
		// make demo in a terminal: the page stays up until Ctrl-C.
		fmt.Fprintf(out, "\nTook %s. The status page shows this data; open it in a browser, Ctrl-C ends the demo:\n\n  %s\n",
			time.Since(start).Round(100*time.Millisecond), status)
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		restore := demoForeground()
		t.Cleanup(restore)
		// A parent that dies (make forwarded a SIGTERM to go test) leaves
		// nobody to end the demo: it ends itself.
		parent := os.Getppid()
		tick := time.NewTicker(500 * time.Millisecond)
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				waiting = false
			case <-tick.C:
				waiting = os.Getppid() == parent
			}
		}
		tick.Stop()
		restore()
		stop()
	}
	if err := a.stop(); err != nil {
		t.Fatalf("run: %v\n%s", err, a.logs)
	}
	if os.Getenv("PLAYWATCH_DEMO_WAIT") != "1" {
		fmt.Fprintf(out, "\nplaywatch stopped; %s is removed when the demo ends. Took %s.\n", dir, time.Since(start).Round(100*time.Millisecond))
		fmt.Fprintf(out, "While it ran, the status page was at\n\n  %s\n\n(make demo in a terminal keeps it open until Ctrl-C.)\n", status)
	}
}

// reviews24hCell is the overview's "Reviews, 24 h" cell of an app, with its
// total.
var reviews24hCell = regexp.MustCompile(`data-label="Reviews, 24 h"><span class="total">([0-9,]+)</span>`)

// demoAddr is the address the environment variable name gives the demo's
// appliance, or a free loopback port.
func demoAddr(t *testing.T, name string) string {
	if addr := os.Getenv(name); addr != "" {
		return addr
	}
	return freeAddr(t)
}

// demoRegister posts body to the registry API at base, with the bearer
// token when there is one, and returns the status and the answer.
func demoRegister(t *testing.T, base, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/api/v1/apps", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	code, body, _ := readAnswer(t, resp, err)
	return code, body
}

// reachable is a listen address as a client reaches it: a wildcard or empty
// host (":8080", "0.0.0.0:8080") means this host, reached as localhost.
func reachable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return net.JoinHostPort(host, port)
}

// demoForeground makes the demo's own process group the foreground group of
// its terminal for the wait, so that Ctrl-C reaches the demo alone: it stops
// the appliance and passes, and make, which dies of any SIGINT it receives
// itself (after its recipe ended, whatever the recipe's status), sees a
// recipe that succeeded and exits 0. It returns what gives the terminal
// back; without a terminal of which it is in the foreground it does nothing.
func demoForeground() (restore func()) {
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return func() {}
	}
	fd := tty.Fd()
	var fg int32
	if ttyPgrp(fd, syscall.TIOCGPGRP, &fg) != nil || int(fg) != syscall.Getpgrp() {
		tty.Close()
		return func() {}
	}
	// A background group that sets the foreground gets SIGTTOU; Ctrl-Z
	// would stop the demo alone, with nobody left to continue it.
	signal.Ignore(syscall.SIGTTOU, syscall.SIGTSTP)
	own := int32(os.Getpid())
	if syscall.Setpgid(0, 0) != nil || ttyPgrp(fd, syscall.TIOCSPGRP, &own) != nil {
		_ = syscall.Setpgid(0, int(fg))
		tty.Close()
		return func() {}
	}
	return sync.OnceFunc(func() {
		_ = ttyPgrp(fd, syscall.TIOCSPGRP, &fg)
		tty.Close()
	})
}

// ttyPgrp gets (TIOCGPGRP) or sets (TIOCSPGRP) the foreground process group
// of the terminal fd.
func ttyPgrp(fd uintptr, req uintptr, pgrp *int32) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(pgrp))); errno != 0 {
		return errno
	}
	return nil
}

// indent indents every line of s by two spaces.
func indent(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString("  " + line)
	}
	return b.String()
}

// printQuery prints the result of sql as an aligned table.
func printQuery(t *testing.T, out io.Writer, pool *pgxpool.Pool, sql string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	defer rows.Close()
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	var header []string
	for _, f := range rows.FieldDescriptions() {
		header = append(header, f.Name)
	}
	fmt.Fprintln(w, "  "+strings.Join(header, "\t"))
	for rows.Next() {
		values, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		cells := make([]string, len(values))
		for i, v := range values {
			switch v := v.(type) {
			case nil:
				cells[i] = "NULL"
			case time.Time:
				cells[i] = v.UTC().Format(time.DateTime)
			default:
				cells[i] = fmt.Sprint(v)
			}
		}
		fmt.Fprintln(w, "  "+strings.Join(cells, "\t"))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	w.Flush()
}

// The demo's replay store moves each app's recorded times (reviews, replies,
// the listing's update and release) by one shift, so that the newest is
// just now: recorded pages and generated reviews alike. Without the option
// the store serves the recorded times, as every other test expects.
func TestReplayPlayStoreShiftsRecordedTimes(t *testing.T) {
	const generated, recorded = "com.example.shifted", "com.google.android.apps.translate"
	now := time.Now()
	stores := map[bool]*replayPlayStore{}
	for _, shifted := range []bool{false, true} {
		rs := newReplayPlayStore(t)
		rs.setApp(generated, replayApp{Reviews: 40})
		rs.setApp(recorded, replayApp{DetailsPage: readPlaystoreFixture(t, "details_"+recorded+"_en_us.html")})
		rs.useFixtureReviews(recorded)
		if shifted {
			rs.shiftTimesTo(now)
		}
		stores[shifted] = rs
	}
	fetch := func(rs *replayPlayStore, pkg string) (appDetails, []review) {
		t.Helper()
		ts := newTestPlayStore(t, rs.URL, nil)
		d, err := ts.client.Details(context.Background(), pkg, "en", "us")
		if err != nil {
			t.Fatal(err)
		}
		reviews, err := ts.client.Reviews(context.Background(), pkg, "en", "us", 0, nil)
		if err != nil || len(reviews) == 0 {
			t.Fatalf("reviews of %s: %d, %v", pkg, len(reviews), err)
		}
		return d, reviews
	}
	shiftedBy := func(got, was *time.Time, d time.Duration) bool {
		return (got == nil) == (was == nil) && (got == nil || got.Equal(was.Add(d)))
	}
	for _, pkg := range []string{generated, recorded} {
		wasDetails, was := fetch(stores[false], pkg)
		details, got := fetch(stores[true], pkg)
		if pkg == generated {
			for i, r := range was {
				if !r.At.Equal(replayReviewAt(i)) {
					t.Fatalf("%s without the option: review %d at %v, want the recorded %v", pkg, i, r.At, replayReviewAt(i))
				}
			}
		}
		if len(got) != len(was) {
			t.Fatalf("%s: %d reviews shifted, %d recorded", pkg, len(got), len(was))
		}
		d := got[0].At.Sub(was[0].At)
		if d < 30*24*time.Hour {
			t.Errorf("%s: shifted by %s, want the months since the recording", pkg, d)
		}
		newest := *details.UpdatedAt
		for i, r := range got {
			newest = laterTime(newest, r.At)
			if r.RepliedAt != nil {
				newest = laterTime(newest, *r.RepliedAt)
			}
			if r.ReviewID != was[i].ReviewID || !r.At.Equal(was[i].At.Add(d)) || !shiftedBy(r.RepliedAt, was[i].RepliedAt, d) {
				t.Errorf("%s review %d: %s at %v replied %v; want %s at %v replied %v, shifted by %s",
					pkg, i, r.ReviewID, r.At, r.RepliedAt, was[i].ReviewID, was[i].At, was[i].RepliedAt, d)
			}
		}
		if newest.After(now) || newest.Before(now.Add(-time.Second)) {
			t.Errorf("%s: newest time (review, reply or update) %v, want within the second before %v", pkg, newest, now)
		}
		if got[0].At.Before(now.Add(-24 * time.Hour)) {
			t.Errorf("%s: newest review at %v, want one of the last 24 h", pkg, got[0].At)
		}
		text := "no text"
		if details.UpdatedText != nil {
			text = *details.UpdatedText
		}
		if !shiftedBy(details.UpdatedAt, wasDetails.UpdatedAt, d) || !shiftedBy(details.ReleasedAt, wasDetails.ReleasedAt, d) ||
			text != details.UpdatedAt.Format("Jan 2, 2006") {
			t.Errorf("%s listing: updated %v (%s), released %v; want %v and %v shifted by %s", pkg,
				details.UpdatedAt, text, details.ReleasedAt, wasDetails.UpdatedAt, wasDetails.ReleasedAt, d)
		}
		if !reflect.DeepEqual(details.Histogram, wasDetails.Histogram) || details.Title != wasDetails.Title {
			t.Errorf("%s listing: only the times change, got title %q, histogram %v", pkg, details.Title, details.Histogram)
		}
	}
}
