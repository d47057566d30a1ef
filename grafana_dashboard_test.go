package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// grafanaDashboardFile is the shipped dashboard (README "Alerts and
// dashboards"); the data source uids are those of its provisioning file.
var grafanaDashboardFile = filepath.Join("deploy", "grafana", "playwatch.json")

const (
	grafanaPrometheusUID = "playwatch-prometheus"
	grafanaPostgresUID   = "playwatch-postgres"
)

type grafanaDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type grafanaTarget struct {
	Datasource grafanaDatasource `json:"datasource"`
	Expr       string            `json:"expr"`
	RawSQL     string            `json:"rawSql"`
	Format     string            `json:"format"`
}

type grafanaPanel struct {
	Type       string            `json:"type"`
	Title      string            `json:"title"`
	Datasource grafanaDatasource `json:"datasource"`
	Targets    []grafanaTarget   `json:"targets"`
	Panels     []grafanaPanel    `json:"panels"`
}

type grafanaDashboard struct {
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string            `json:"name"`
			Query      string            `json:"query"`
			Datasource grafanaDatasource `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []grafanaPanel `json:"panels"`
}

func loadGrafanaDashboard(t testing.TB) grafanaDashboard {
	t.Helper()
	return readJSONFile[grafanaDashboard](t, grafanaDashboardFile)
}

// targets are every query of the dashboard's panels, rows included, with
// the title of their panel.
func (d grafanaDashboard) targets() (titles []string, targets []grafanaTarget) {
	var walk func([]grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				titles, targets = append(titles, p.Title), append(targets, tg)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return titles, targets
}

// The dashboard's panels each query one of the two provisioned data sources
// with a query of its kind, and the provisioning files name those uids and
// the env placeholders the README documents.
func TestGrafanaDashboardFiles(t *testing.T) {
	d := loadGrafanaDashboard(t)
	titles, targets := d.targets()
	var prom, sql int
	for i, tg := range targets {
		switch {
		case tg.Datasource.UID == grafanaPrometheusUID && tg.Expr != "" && tg.RawSQL == "":
			prom++
		case tg.Datasource.UID == grafanaPostgresUID && tg.RawSQL != "" && tg.Expr == "":
			sql++
		default:
			t.Errorf("panel %q: a query on data source %q with expr %q and rawSql %q", titles[i], tg.Datasource.UID, tg.Expr, tg.RawSQL)
		}
	}
	if prom < 10 || sql < 8 {
		t.Errorf("%d PromQL and %d SQL queries; the ops and trend panels are gone", prom, sql)
	}
	ds, err := os.ReadFile(filepath.Join("deploy", "grafana", "provisioning", "datasources", "playwatch.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"uid: " + grafanaPrometheusUID, "uid: " + grafanaPostgresUID, "user: " + pgReaderRole,
		"${PLAYWATCH_PROMETHEUS_URL}", "${PLAYWATCH_PG_ADDR}", "${PLAYWATCH_READER_PASSWORD}"} {
		if !strings.Contains(string(ds), want) {
			t.Errorf("the datasources provisioning file lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join("deploy", "grafana", "provisioning", "dashboards", "playwatch.yml")); err != nil {
		t.Error(err)
	}
}

// fillDashboardData gives every trend panel rows: sentiment labels on the
// crawled reviews and a network-metrics row of the messaging app, once the
// consumer has stored the crawl and the dead letter.
func fillDashboardData(t *testing.T, writer *pgxpool.Pool, messagingApp string) {
	t.Helper()
	waitFor(t, 20*time.Second, "the crawl and the dead letter to be stored", func() bool {
		return count(t, writer, "SELECT count(*) FROM reviews") >= 40 && count(t, writer, "SELECT count(*) FROM app_stats") > 0 &&
			count(t, writer, "SELECT count(*) FROM dead_letter_events") > 0
	})
	ctx := context.Background()
	if _, err := writer.Exec(ctx, `UPDATE reviews SET sentiment = CASE WHEN score <= 2 THEN 'NEGATIVE' WHEN score = 3 THEN 'NEUTRAL' ELSE 'POSITIVE' END
		WHERE id % 2 = 0`); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, `INSERT INTO network_metrics (application_id, analysis_id, scenario, rtt_handshake, retransmission_count,
		bytes_transferred_total, bytes_payload_total, overhead_ratio, analyzed_at)
		SELECT id, gen_random_uuid(), 'UPLOAD', 41.5, 3, 1000, 900, 0.1, now() FROM apps_registry_application WHERE package_name = $1`, messagingApp); err != nil {
		t.Fatal(err)
	}
	if n := count(t, writer, "SELECT count(*) FROM reviews WHERE sentiment = 'NEGATIVE'"); n == 0 {
		t.Fatal("no review scored 1 or 2 stars to label NEGATIVE")
	}
}

// grafanaSQLMacro matches the Grafana PostgreSQL macros the dashboard may use.
var grafanaSQLMacro = regexp.MustCompile(`\$__(timeFilter|timeGroupAlias|timeGroup)\(([^,()]+)(?:,\s*([^()]+))?\)`)

// expandGrafanaSQL does what Grafana does to a panel's SQL before it sends
// it: the time range macros over [from, to], the package variable as the
// quoted list of its values. What is left with a $ is a macro this test
// does not know, and fails.
func expandGrafanaSQL(t testing.TB, sql string, from, to time.Time, packages []string) string {
	t.Helper()
	var bad []string
	out := grafanaSQLMacro.ReplaceAllStringFunc(sql, func(m string) string {
		g := grafanaSQLMacro.FindStringSubmatch(m)
		col := strings.TrimSpace(g[2])
		switch g[1] {
		case "timeFilter":
			return fmt.Sprintf("%s BETWEEN '%s' AND '%s'", col, from.Format(time.RFC3339), to.Format(time.RFC3339))
		default:
			d, err := time.ParseDuration(strings.Replace(strings.TrimSpace(g[3]), "d", "h", 1))
			if strings.HasSuffix(strings.TrimSpace(g[3]), "d") {
				d *= 24
			}
			if err != nil || d <= 0 {
				bad = append(bad, m)
				return m
			}
			group := fmt.Sprintf("floor(extract(epoch from %s)/%d)*%d", col, int(d.Seconds()), int(d.Seconds()))
			if g[1] == "timeGroupAlias" {
				group += ` AS "time"`
			}
			return group
		}
	})
	quoted := make([]string, len(packages))
	for i, p := range packages {
		quoted[i] = "'" + strings.ReplaceAll(p, "'", "''") + "'"
	}
	out = strings.ReplaceAll(out, "$package", strings.Join(quoted, ","))
	if len(bad) > 0 || strings.Contains(out, "$") {
		t.Fatalf("SQL with a macro or variable the test cannot expand (%v):\n%s", bad, out)
	}
	return out
}

// checkDashboardSQL runs the package variable's query and every SQL panel as
// the read-only role, and wants rows from each.
func checkDashboardSQL(t *testing.T, reader *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	d := loadGrafanaDashboard(t)
	var packages []string
	for _, v := range d.Templating.List {
		if v.Name != "package" || v.Datasource.UID != grafanaPostgresUID {
			t.Fatalf("unknown dashboard variable %q on %q", v.Name, v.Datasource.UID)
		}
		rows, err := reader.Query(ctx, v.Query)
		if err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		for rows.Next() {
			var p string
			if err := rows.Scan(&p); err != nil {
				t.Fatal(err)
			}
			packages = append(packages, p)
		}
		if rows.Err() != nil || len(packages) == 0 {
			t.Fatalf("variable %s: %v, values %v", v.Name, rows.Err(), packages)
		}
	}
	from, to := time.Now().AddDate(-1, 0, 0), time.Now().Add(time.Hour)
	titles, targets := d.targets()
	for i, tg := range targets {
		if tg.RawSQL == "" {
			continue
		}
		sql := expandGrafanaSQL(t, tg.RawSQL, from, to, packages)
		rows, err := reader.Query(ctx, sql)
		if err != nil {
			t.Errorf("panel %q: %v\n%s", titles[i], err, sql)
			continue
		}
		n := 0
		for rows.Next() {
			n++
		}
		fields := rows.FieldDescriptions()
		if err := rows.Err(); err != nil {
			t.Errorf("panel %q: %v\n%s", titles[i], err, sql)
		} else if n == 0 {
			t.Errorf("panel %q: no rows on data that has them\n%s", titles[i], sql)
		}
		if tg.Format == "time_series" {
			var names []string
			for _, f := range fields {
				names = append(names, f.Name)
			}
			if !slices.Contains(names, "time") || !slices.Contains(names, "value") {
				t.Errorf("panel %q: a time series without time and value columns: %v", titles[i], names)
			}
		}
	}
}

// expandGrafanaPromQL replaces Grafana's interval variables and the package
// variable (as a regex matching every package).
func expandGrafanaPromQL(t testing.TB, expr string) string {
	t.Helper()
	out := strings.NewReplacer("$__rate_interval", "1m", "$__interval", "15s", "$__range", "1h", "$package", ".+").Replace(expr)
	if strings.Contains(out, "$") {
		t.Fatalf("PromQL with a variable the test cannot expand: %s", out)
	}
	return out
}

// checkDashboardPromQL runs every PromQL expression of the dashboard through
// Prometheus; one whose metrics are all exposed here must return series.
func checkDashboardPromQL(t *testing.T, prom string) {
	t.Helper()
	titles, targets := loadGrafanaDashboard(t).targets()
	for i, tg := range targets {
		if tg.Expr == "" {
			continue
		}
		expr := expandGrafanaPromQL(t, tg.Expr)
		r := promQuery(t, prom, expr)
		if len(r) == 0 {
			t.Errorf("panel %q: %s returns nothing from a running appliance", titles[i], expr)
		}
	}
}

var metricNameToken = regexp.MustCompile(`\b(?:playwatch|process|go)_[a-z0-9_]+\b`)

// metricNamesIn lists the metric names an expression uses.
func metricNamesIn(expr string) []string {
	names := metricNameToken.FindAllString(expr, -1)
	slices.Sort(names)
	return slices.Compact(names)
}

// checkMetricNames wants every metric name of the rules and the dashboard
// on the appliance's /metrics.
func checkMetricNames(t *testing.T, base string) {
	t.Helper()
	exposed := map[string]bool{}
	for line := range strings.Lines(metricsText(t, base)) {
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		exposed[name] = true
	}
	rules, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	exprs := []string{}
	for line := range strings.Lines(string(rules)) {
		// Annotations name metrics in advice, which need not be exposed.
		if !strings.Contains(line, "description:") && !strings.Contains(line, "summary:") {
			exprs = append(exprs, line)
		}
	}
	_, targets := loadGrafanaDashboard(t).targets()
	for _, tg := range targets {
		exprs = append(exprs, tg.Expr)
	}
	used := metricNamesIn(strings.Join(exprs, "\n"))
	if len(used) < 20 {
		t.Fatalf("only %d metric names found in the rules and the dashboard: %v", len(used), used)
	}
	for _, name := range used {
		if !exposed[name] {
			t.Errorf("%s is used by the alert rules or the dashboard but not exposed on /metrics", name)
		}
	}
}
