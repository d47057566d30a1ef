package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// alertRulesFile and alertTestFiles are the shipped rules and their promtool
// unit tests (README "Alerts and dashboards").
var (
	alertRulesFile = filepath.Join("deploy", "prometheus", "alerts.yml")
	alertTestFiles = []string{
		filepath.Join("deploy", "prometheus", "alerts_test.yml"),
		filepath.Join("deploy", "prometheus", "alerts_history_test.yml"),
	}
)

// requirePrometheusTool returns the path of Debian's prometheus or promtool
// binary; without it the test is skipped, except under CI=true, where
// .ci/run installs the package.
func requirePrometheusTool(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is required under CI=true (.ci/run installs Debian's prometheus)", name)
		}
		t.Skipf("%s is not on PATH (Debian: apt-get install prometheus): the alert rules are not checked", name)
	}
	return path
}

// The rules parse, and every alert fires in its unit tests and stays quiet
// on the series beside it; an alert without both kinds of test fails.
func TestAlertRulesPromtool(t *testing.T) {
	t.Parallel()
	promtool := requirePrometheusTool(t, "promtool")
	for _, args := range [][]string{{"check", "rules", alertRulesFile}, append([]string{"test", "rules"}, alertTestFiles...)} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	rules, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests strings.Builder
	for _, f := range alertTestFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tests.Write(b)
	}
	alerts := alertNames(string(rules))
	if len(alerts) != 10 {
		t.Errorf("%d alerts in %s, want the 10 the README lists: %v", len(alerts), alertRulesFile, alerts)
	}
	firing, quiet := alertTestCases(tests.String())
	for _, a := range alerts {
		if firing[a] == 0 {
			t.Errorf("%s has no unit test in which it fires", a)
		}
		if quiet[a] == 0 {
			t.Errorf("%s has no unit test in which it stays quiet (exp_alerts: [] or a series beside the firing one)", a)
		}
	}
}

// alertNames lists the `- alert: NAME` entries of a rules file.
func alertNames(rules string) []string {
	var names []string
	for line := range strings.Lines(rules) {
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "- alert: "); ok {
			names = append(names, strings.TrimSpace(name))
		}
	}
	return names
}

// alertTestCases counts, per alert, the alert_rule_test cases in which it is
// expected to fire and those that show it quiet: an empty exp_alerts, or
// input series of more packages or instances than the alerts expected
// (the test group's other series must then stay quiet, or promtool fails).
func alertTestCases(tests string) (firing, quiet map[string]int) {
	firing, quiet = map[string]int{}, map[string]int{}
	for _, group := range strings.Split(tests, "\n  - interval:")[1:] {
		cases := strings.Split(group, "- eval_time:")
		for _, c := range cases[1:] {
			name := ""
			for line := range strings.Lines(c) {
				if n, ok := strings.CutPrefix(strings.TrimSpace(line), "alertname: "); ok {
					name = n
				}
			}
			exp := strings.Count(c, "- exp_labels:")
			if exp > 0 {
				firing[name]++
			}
			if exp == 0 || distinctSeriesKeys(group) > exp {
				quiet[name]++
			}
		}
	}
	return firing, quiet
}

// distinctSeriesKeys counts the distinct package (with its storefront) or
// instance values of a test group's input series: the subjects an alert
// could fire for.
func distinctSeriesKeys(group string) int {
	keys := map[string]bool{}
	for line := range strings.Lines(group) {
		if !strings.Contains(line, "- series:") {
			continue
		}
		key := ""
		for _, label := range []string{`package="`, `country="`, `lang="`, `instance="`, `topic="`, `reason="`, `path="`} {
			if i := strings.Index(line, label); i >= 0 {
				rest := line[i+len(label):]
				key += label + rest[:strings.IndexByte(rest, '"')]
			}
		}
		keys[key] = true
	}
	return len(keys)
}
