package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The appliance scraped by Debian's prometheus with the shipped rules (their
// `for:` shortened to a second): the target is up, an app the store answers
// 404 for fires PlaywatchAppNotCrawled after two 4-second intervals while
// the healthy app never does, and a dead letter fires PlaywatchDeadLetters.
// The same appliance then serves the dashboard's checks: every SQL panel as
// playwatch_reader, every PromQL expression through this Prometheus, and
// every metric name they and the rules use on /metrics.
func TestRealPrometheusAlertsAndDashboard(t *testing.T) {
	t.Parallel()
	promBin := requirePrometheusTool(t, "prometheus")
	const gone, fine = "com.example.gone", "com.example.fine"
	replay := newReplayPlayStore(t)
	replay.setApp(gone, replayApp{DetailsAlways: fault404})
	replay.setApp(fine, replayApp{Reviews: 40})
	env := map[string]string{
		"PLAYWATCH_DATA_DIR":    filepath.Join(tempDataDir(t), "data"),
		"PLAYWATCH_HTTP_ADDR":   freeAddr(t),
		"PLAYWATCH_BROKER_ADDR": freeAddr(t),
		"PLAYSTORE_URL":         replay.URL,
		"RATE_LIMIT_REQUESTS":   "0",
		"EGRESS_MIN_GAP":        "0s",
		"REVIEWS_PER_APP":       "40",
		"CRAWL_INTERVAL":        "4s",
		"CRAWL_NEW_APP_CHECK":   "1s",
		"APP_GAUGES_INTERVAL":   "1s",
		"LOG_LEVEL":             "warn",
	}
	base, _, logs := startRun(t, env)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("playwatch run:\n%s", logs)
		}
	})
	for _, body := range []string{`{"package_name":"` + gone + `"}`, `{"package_name":"` + fine + `","is_messaging_app":true}`} {
		if code, resp := httpDo(t, "POST", base+"/api/v1/apps", body); code != 201 {
			t.Fatalf("register: %d %s", code, resp)
		}
	}
	prom := startPrometheus(t, promBin, env["PLAYWATCH_HTTP_ADDR"])

	waitFor(t, 20*time.Second, "the appliance's target to be up", func() bool {
		r := promQuery(t, prom, `up{job="playwatch"} == 1`)
		return len(r) == 1 && r[0].Metric["instance"] == env["PLAYWATCH_HTTP_ADDR"]
	})
	waitFor(t, 30*time.Second, "PlaywatchAppNotCrawled to fire for "+gone, func() bool {
		return promAlertState(t, prom, "PlaywatchAppNotCrawled", gone) == "firing"
	})
	if r := promQuery(t, prom, `max_over_time(ALERTS{alertname="PlaywatchAppNotCrawled", package="`+fine+`"}[5m])`); len(r) != 0 {
		t.Errorf("PlaywatchAppNotCrawled was active for the healthy %s: %v", fine, r)
	}
	if r := promQuery(t, prom, `playwatch_crawl_consecutive_failures{package="`+gone+`", path="stats"} >= 2`); len(r) != 1 {
		t.Errorf("Prometheus has no failure streak of 2 for %s: %v", gone, r)
	}

	// A record that breaks its contract: a dead letter, through the real
	// consumer, and its alert.
	produce(t, []string{env["PLAYWATCH_BROKER_ADDR"]}, rec(topicReviews, fine, []byte("not json")))
	waitFor(t, 20*time.Second, "PlaywatchDeadLetters to fire", func() bool {
		return promAlertState(t, prom, "PlaywatchDeadLetters", "") == "firing"
	})

	writer := newTestPoolFor(t, dbURLOf(t, env, "db-url"))
	reader := newTestPoolFor(t, dbURLOf(t, env, "db-url", "--reader"))
	fillDashboardData(t, writer, fine)
	// The per-app gauges are read from PostgreSQL in the background (every
	// APP_GAUGES_INTERVAL): the panels' delta() wants two scrapes of the
	// filled data.
	waitFor(t, 30*time.Second, "two scrapes of the filled data's per-app gauges", func() bool {
		return len(promQuery(t, prom, `count_over_time(playwatch_app_score{package="`+fine+`"}[1m]) >= 2`)) == 1
	})
	checkDashboardSQL(t, reader)
	checkDashboardPromQL(t, prom)
	checkMetricNames(t, base)
}

// dbURLOf is what `playwatch db-url` (with args) prints for the running
// appliance.
func dbURLOf(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	var out strings.Builder
	if err := run(context.Background(), args, envFunc(env), &out, io.Discard); err != nil {
		t.Fatalf("playwatch %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(out.String())
}

// startPrometheus runs prometheus on a free loopback port with a temporary
// storage directory, scraping target every second and evaluating a copy of
// the rules every second, with every `for:` cut to 1s.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	rules, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+for: )\S+$`).ReplaceAll(rules, []byte("${1}1s"))
	rulesPath := filepath.Join(dir, "alerts.yml")
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: playwatch
    static_configs:
      - targets: [%q]
`, rulesPath, target)
	configPath := filepath.Join(dir, "prometheus.yml")
	for path, body := range map[string][]byte{rulesPath: rules, configPath: []byte(config)} {
		if err := os.WriteFile(path, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addr := freeAddr(t)
	startAlertingDaemon(t, "prometheus", bin, "http://"+addr+"/-/ready", "--config.file="+configPath, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+addr, "--log.level=warn")
	base := "http://" + addr
	return base
}

// promSample is one element of an instant vector from the HTTP API.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// promAPI gets a path of Prometheus' HTTP API and decodes its data; an
// answer other than success fails the test with Prometheus' error.
func promAPI(t testing.TB, base, path string, data any) {
	t.Helper()
	resp, err := http.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Status    string          `json:"status"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
		Data      json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if body.Status != "success" {
		t.Fatalf("%s: %s %s", path, body.ErrorType, body.Error)
	}
	if err := json.Unmarshal(body.Data, data); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// promQuery runs an instant query now.
func promQuery(t testing.TB, base, query string) []promSample {
	t.Helper()
	var data struct {
		ResultType string       `json:"resultType"`
		Result     []promSample `json:"result"`
	}
	promAPI(t, base, "/api/v1/query?query="+url.QueryEscape(query), &data)
	if data.ResultType != "vector" && data.ResultType != "scalar" {
		t.Fatalf("%s: a %s, not a vector", query, data.ResultType)
	}
	return data.Result
}

// promAlertState is the state (pending, firing, or "") of the alert named,
// for the package given ("": any).
func promAlertState(t testing.TB, base, name, pkg string) string {
	t.Helper()
	var data struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	promAPI(t, base, "/api/v1/alerts", &data)
	state := ""
	for _, a := range data.Alerts {
		if a.Labels["alertname"] == name && (pkg == "" || a.Labels["package"] == pkg) && state != "firing" {
			state = a.State
		}
	}
	return state
}
