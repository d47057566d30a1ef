package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The appliance crawls, stops, and its embedded broker's data is deleted
// (data/broker) while its PostgreSQL stays. Started again, it crawls newly
// registered apps: every review and listing of theirs is stored, although
// their records have offsets below those stored of the old logs; the
// resets are counted on /metrics and shown on /readyz, which answers 200.
// Two appliance starts and two crawls: in the fault suite.
func TestFaultApplianceStoresEverythingAfterItsBrokerDataWasDeleted(t *testing.T) {
	requireFaultSuite(t)
	const apps, reviewsPerApp = 6, 60
	replay := newReplayPlayStore(t)
	dataDir := filepath.Join(tempDataDir(t), "data")
	env := applianceEnv(t, dataDir, map[string]string{
		"PLAYSTORE_URL":       replay.URL,
		"RATE_LIMIT_REQUESTS": "0",
		"EGRESS_MIN_GAP":      "0s",
		"CRAWL_INTERVAL":      "1h",
		"CRAWL_NEW_APP_CHECK": "1s",
		"LOG_LEVEL":           "warn",
	})
	var pool *pgxpool.Pool
	openPool := func() {
		var err error
		if pool, err = pgxpool.New(context.Background(), attachedTestConfig(t, dataDir).DatabaseURL); err != nil {
			t.Fatal(err)
		}
	}
	// storedOf counts the reviews and app-stats rows of the apps named prefix….
	storedOf := func(prefix string) (reviews, stats int) {
		like := "com.example." + prefix + "%"
		reviews = count(t, pool, `SELECT count(*) FROM reviews r JOIN apps_registry_application a ON a.id = r.application_id WHERE a.package_name LIKE $1`, like)
		stats = count(t, pool, `SELECT count(DISTINCT s.application_id) FROM app_stats s JOIN apps_registry_application a ON a.id = s.application_id WHERE a.package_name LIKE $1`, like)
		return reviews, stats
	}

	base, stop, logs := startRun(t, env)
	openPool()
	registerReplayApps(t, replay, base, "before", apps, reviewsPerApp)
	waitFor(t, time.Minute, "the first apps stored", func() bool {
		r, s := storedOf("before")
		return r == apps*reviewsPerApp && s == apps
	})
	var storedPartitions int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM consumer_offsets WHERE next_offset > 0 AND topic IN ('reviews', 'app-stats')`).Scan(&storedPartitions); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	if err := stop(); err != nil {
		t.Fatalf("run 1: %v\n%s", err, logs)
	}
	if err := os.RemoveAll(filepath.Join(dataDir, "broker")); err != nil {
		t.Fatal(err)
	}

	base, stop, logs = startRun(t, env)
	openPool()
	defer pool.Close()
	registerReplayApps(t, replay, base, "after", apps, reviewsPerApp)
	waitFor(t, time.Minute, "every review and listing of the apps registered after the broker's data was deleted", func() bool {
		r, s := storedOf("after")
		return r == apps*reviewsPerApp && s == apps
	})
	if r, s := storedOf("before"); r != apps*reviewsPerApp || s != apps {
		t.Errorf("the first apps: %d reviews, %d with app-stats; want %d and %d", r, s, apps*reviewsPerApp, apps)
	}
	m := scrapeMetrics(t, base)
	var resets float64
	for k, v := range m {
		if strings.HasPrefix(k, "playwatch_consumer_offset_resets_total{") {
			resets += v
		}
	}
	if resets < 1 || resets > float64(storedPartitions) {
		t.Errorf("%v offset resets counted, want 1 to %d (the partitions stored before)", resets, storedPartitions)
	}
	code, body := httpDo(t, "GET", base+"/readyz", "")
	var ready struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal([]byte(body), &ready); err != nil || code != http.StatusOK || ready.Status != "ready" ||
		!strings.HasPrefix(ready.Checks["consumer"], "ok; partitions reset") {
		t.Errorf("/readyz: %d %s; want 200, ready, the consumer naming the reset partitions", code, body)
	}
	if err := stop(); err != nil {
		t.Errorf("run 2: %v", err)
	}
	if !strings.Contains(logs.String(), "partition reset") {
		t.Errorf("run 2's log does not tell of the reset:\n%s", logs)
	}
}
