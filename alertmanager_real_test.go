package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

var alertmanagerConfigFile = filepath.Join("deploy", "alertmanager", "alertmanager.yml")

// The shipped Alertmanager config, with Debian's prometheus-alertmanager
// and prometheus: Prometheus scrapes a /metrics on which one app has a
// negative-review spike and another has not, evaluates the shipped rules
// and sends to the Alertmanager, which routes by the shipped config (its
// placeholders pointed at local receivers answering as Slack, Telegram and
// a webhook receiver do). The spike arrives at each, grouped by alertname
// and package; the calm app never does.
func TestAlertmanagerRoutesPlaywatchAlert(t *testing.T) {
	t.Parallel()
	promBin := requirePrometheusTool(t, "prometheus")
	amBin := firstOnPath("prometheus-alertmanager", "alertmanager")
	if amBin == "" {
		skipOrFailUnderCI(t, "prometheus-alertmanager is not installed (Debian: apt-get install prometheus-alertmanager)")
	}
	const spiky, calm = "com.example.spiky", "com.example.calm"

	webhook := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) { w.WriteHeader(200) })
	slack := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) { io.WriteString(w, "ok") })
	telegram := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) {
		io.WriteString(w, `{"ok":true,"result":{"message_id":7,"chat":{"id":-1001234567890,"type":"supergroup"},"date":1764650000}}`)
	})
	metrics := newNotifyTestReceiver(t, func(w http.ResponseWriter, _ notifyReceivedRequest) {
		fmt.Fprintf(w, "# TYPE playwatch_app_negative_reviews_1h gauge\n"+
			"playwatch_app_negative_reviews_1h{package=%q,country=\"ir\",lang=\"fa\"} 9\nplaywatch_app_negative_reviews_1h{package=%q,country=\"ir\",lang=\"fa\"} 1\n"+
			"# TYPE playwatch_app_negative_reviews_7d gauge\n"+
			"playwatch_app_negative_reviews_7d{package=%q,country=\"ir\",lang=\"fa\"} 20\nplaywatch_app_negative_reviews_7d{package=%q,country=\"ir\",lang=\"fa\"} 20\n",
			spiky, calm, spiky, calm)
	})

	dir := t.TempDir()
	shipped, err := os.ReadFile(alertmanagerConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	config := string(shipped)
	for placeholder, local := range map[string]string{
		"/etc/alertmanager/secrets/":                 dir + "/",
		"https://api.telegram.org":                   telegram.URL,
		"https://hooks.example.com/playwatch-alerts": webhook.URL + "/alerts",
		"smtp.example.com:587":                       freeAddr(t), // nobody listens: the mail fails, locally
	} {
		if !strings.Contains(config, placeholder) {
			t.Fatalf("%s has no %q any more: update this test", alertmanagerConfigFile, placeholder)
		}
		config = strings.ReplaceAll(config, placeholder, local)
	}
	config = regexp.MustCompile(`(?m)^(\s+group_(wait|interval): )\S+$`).ReplaceAllString(config, "${1}1s")
	amConfig := filepath.Join(dir, "alertmanager.yml")
	for path, body := range map[string]string{
		amConfig:                                config,
		filepath.Join(dir, "slack_webhook_url"): slack.URL + "/services/T000/B000/XXXX",
		filepath.Join(dir, "smtp_password"):     "not-used",
	} {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	amAddr := freeAddr(t)
	startAlertingDaemon(t, "alertmanager", amBin, "http://"+amAddr+"/-/ready", "--config.file="+amConfig,
		"--storage.path="+filepath.Join(dir, "am"), "--web.listen-address="+amAddr,
		"--cluster.listen-address=", "--log.level=warn")

	rules, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	rules = regexp.MustCompile(`(?m)^(\s+for: )\S+$`).ReplaceAll(rules, []byte("${1}1s"))
	rulesPath := filepath.Join(dir, "alerts.yml")
	promConfig := filepath.Join(dir, "prometheus.yml")
	for path, body := range map[string]string{rulesPath: string(rules), promConfig: fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
alerting:
  alertmanagers:
    - static_configs:
        - targets: [%q]
scrape_configs:
  - job_name: playwatch
    static_configs:
      - targets: [%q]
`, rulesPath, amAddr, strings.TrimPrefix(metrics.URL, "http://"))} {
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	promAddr := freeAddr(t)
	startAlertingDaemon(t, "prometheus", promBin, "http://"+promAddr+"/-/ready", "--config.file="+promConfig,
		"--storage.tsdb.path="+filepath.Join(dir, "tsdb"), "--web.listen-address="+promAddr, "--log.level=warn")

	// Alertmanager's webhook body, version 4.
	type amAlert struct {
		Status string            `json:"status"`
		Labels map[string]string `json:"labels"`
	}
	type amWebhook struct {
		Version     string            `json:"version"`
		Status      string            `json:"status"`
		Receiver    string            `json:"receiver"`
		GroupLabels map[string]string `json:"groupLabels"`
		Alerts      []amAlert         `json:"alerts"`
	}
	var got amWebhook
	waitFor(t, 30*time.Second, "the spike alert at the webhook receiver", func() bool {
		for _, r := range webhook.requests() {
			var g amWebhook
			if json.Unmarshal(r.Body, &g) == nil && g.GroupLabels["package"] == spiky {
				got = g
				return true
			}
		}
		return false
	})
	if got.Version != "4" || got.Status != "firing" || got.Receiver != "playwatch-team" ||
		got.GroupLabels["alertname"] != "PlaywatchNegativeReviewSpike" || len(got.Alerts) != 1 ||
		got.Alerts[0].Labels["package"] != spiky || got.Alerts[0].Labels["severity"] != "warning" {
		t.Errorf("webhook got %+v", got)
	}
	waitFor(t, 10*time.Second, "the spike at the Slack and Telegram receivers", func() bool {
		return len(slack.requests()) > 0 && len(telegram.requests()) > 0
	})
	if s := slack.requests()[0]; s.Path != "/services/T000/B000/XXXX" || !strings.Contains(string(s.Body), spiky+" (ir/fa): 9 negative reviews in the last hour") {
		t.Errorf("slack got %s %s", s.Path, s.Body)
	}
	if tg := telegram.requests()[0]; tg.Path != "/bot123456789:PLACEHOLDER-bot-token/sendMessage" || !strings.Contains(string(tg.Body), spiky) {
		t.Errorf("telegram got %s %s", tg.Path, tg.Body)
	}
	for _, rc := range []*notifyTestReceiver{webhook, slack, telegram} {
		for _, r := range rc.requests() {
			if strings.Contains(string(r.Body), calm) {
				t.Errorf("an alert for the calm app arrived at %s: %s", r.Path, r.Body)
			}
		}
	}
}

// startAlertingDaemon runs a server binary until the test ends and waits for its
// readiness URL.
func startAlertingDaemon(t *testing.T, name, bin, readyURL string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = childProcAttr(false)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s:\n%s", name, out)
		}
	})
	waitFor(t, 30*time.Second, name+" to be ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("%s exited:\n%s", name, out)
		default:
		}
		resp, err := http.Get(readyURL)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}
