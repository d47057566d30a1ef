package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestDemo is `make demo`: the whole pipeline offline, for a newcomer. The
// appliance runs in a temporary directory against the replay Play Store
// (built from testdata/playstore), three apps are registered through the
// API, one crawl cycle and one capture analysis run, and what landed in
// PostgreSQL is printed. It runs only with PLAYWATCH_DEMO=1 and leaves
// nothing behind.
func TestDemo(t *testing.T) {
	if os.Getenv("PLAYWATCH_DEMO") != "1" {
		t.Skip("the offline demo runs with PLAYWATCH_DEMO=1 (make demo)")
	}
	out := os.Stdout
	replay := newReplayPlayStore(t)
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
		"PLAYWATCH_HTTP_ADDR":   freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
		"PLAYSTORE_URL":         replay.URL,
		"RATE_LIMIT_REQUESTS":   "0",
		"EGRESS_MIN_GAP":        "0s",
		"REVIEWS_PER_APP":       "50",
	}
	fmt.Fprintf(out, "playwatch demo: the whole pipeline offline.\nThe Play Store is a replay of recorded pages on %s; the data directory is %s.\n\n",
		replay.URL, env["PLAYWATCH_DATA_DIR"])

	start := time.Now()
	fmt.Fprintln(out, "$ playwatch run --roles registry,consumer,sentiment    # its own PostgreSQL and Kafka-protocol broker, as with no configuration;")
	fmt.Fprintln(out, "                                                      # no crawler role: the crawl cycle below is a one-off")
	// Without the crawler role no scheduler leads, so that crawl --once
	// may plan the cycle (it refuses beside a leader).
	a := startE2EAppliance(t, env, "--roles", "registry,consumer,sentiment")
	fmt.Fprintf(out, "  ready in %s: registry API and /metrics on %s, broker on %s\n\n", time.Since(start).Round(100*time.Millisecond), a.base, a.brokers[0])

	for _, app := range apps {
		fmt.Fprintf(out, "$ curl -s -X POST %s/api/v1/apps -d '%s'\n", a.base, app.body)
		code, body := httpDo(t, http.MethodPost, a.base+"/api/v1/apps", app.body)
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
		<-ctx.Done()
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
