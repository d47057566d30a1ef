package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The appliance crawls through three real HTTP forward proxies (PROXIES),
// one of them dead (its port closed), while the Play Store answers 429 to
// the first requests for two apps and then recovers. The cycle completes
// through the two live proxies, nothing goes direct, and /metrics shows the
// dead proxy benched; the consumer stores every row once.
func TestFaultPlayStoreThrottledOneProxyDead(t *testing.T) {
	requireFaultSuite(t)
	const apps, reviewsPerApp = 6, 300
	began := time.Now()
	replay := newReplayPlayStore(t)
	dead, live1, live2 := newForwardProxy(t, "dead"), newForwardProxy(t, "live1"), newForwardProxy(t, "live2")
	dead.Close()
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	registry := newAppStore(pool)
	pkgs := make([]string, apps)
	for i := range pkgs {
		pkgs[i] = fmt.Sprintf("com.example.throttled%d", i)
		if _, err := registry.Create(context.Background(), newApp{PackageName: pkgs[i]}); err != nil {
			t.Fatal(err)
		}
	}
	// Three 429s: two for app 0's listing, one for app 1's first reviews page.
	replay.setApp(pkgs[0], replayApp{DetailsFaults: []replayFault{fault429, fault429}})
	replay.setApp(pkgs[1], replayApp{ReviewsFaults: []replayFault{fault429}})
	_, brokers := newTestBroker(t, t.TempDir())
	env := map[string]string{
		"DATABASE_URL":        dbURL,
		"KAFKA_BROKERS":       strings.Join(brokers, ","),
		"PLAYWATCH_DATA_DIR":  t.TempDir(),
		"PLAYWATCH_HTTP_ADDR": freeAddr(t),
		"PLAYSTORE_URL":       replay.URL,
		// The dead proxy first: the pool's first lease goes to it.
		"PROXIES":             strings.Join([]string{dead.URL, live1.URL, live2.URL}, ","),
		"RATE_LIMIT_REQUESTS": "0",
		"REVIEWS_PER_APP":     fmt.Sprint(reviewsPerApp),
		"CRAWL_INTERVAL":      "1h",
	}
	// The cycle at the start crawls the registered apps.
	base, stop, logs := startRun(t, env)
	metric := func(name, labels string) float64 { return scrapeMetric(t, base, name, labels) }
	waitFor(t, 3*time.Minute, "the crawl cycle", func() bool { return metric("playwatch_crawl_cycles_total", "") == 1 })
	cycle := time.Since(began)

	for _, path := range []string{pathStats, pathReviews} {
		if n := metric("playwatch_crawl_app_paths_total", fmt.Sprintf(`outcome="ok",path=%q`, path)); n != apps {
			t.Errorf("%s: %v apps ok, want %d", path, n, apps)
		}
	}
	deadHost := strings.TrimPrefix(dead.URL, "http://")
	if v := metric("playwatch_proxy_benched", fmt.Sprintf("proxy=%q", deadHost)); v != 1 {
		t.Errorf("the dead proxy is not benched: playwatch_proxy_benched = %v", v)
	}
	deadErrors := metric("playwatch_playstore_requests_total", fmt.Sprintf(`outcome="error",proxy=%q`, deadHost))
	if deadErrors < 2 || metric("playwatch_playstore_requests_total", fmt.Sprintf(`outcome="ok",proxy=%q`, deadHost)) != 0 {
		t.Errorf("dead proxy: %v failed requests, want 2 or more and none ok", deadErrors)
	}
	throttled := 0.0
	for _, p := range []*forwardProxy{live1, live2} {
		throttled += metric("playwatch_playstore_requests_total", fmt.Sprintf(`outcome="rate_limited",proxy=%q`, p.host()))
	}
	if throttled != 3 {
		t.Errorf("%v rate-limited answers counted, want the 3 the store gave", throttled)
	}
	// Every answer came through a live proxy; none went direct.
	if total, proxied := replay.totalRequests(), replay.proxiedRequests(); total != proxied || live1.count()+live2.count() != total {
		t.Errorf("%d store requests, %d through a proxy, %d+%d at the live proxies", total, proxied, live1.count(), live2.count())
	}

	waitStored(t, time.Minute, brokers, pool, "playwatch-storage")
	if n := count(t, pool, `SELECT count(*) FROM app_stats`); n != apps {
		t.Errorf("%d app_stats rows, want %d", n, apps)
	}
	if n := count(t, pool, `SELECT count(*) FROM reviews`); n != apps*reviewsPerApp {
		t.Errorf("%d reviews rows, want %d", n, apps*reviewsPerApp)
	}
	if n := count(t, pool, `SELECT count(*) FROM dead_letter_events`); n != 0 {
		t.Errorf("%d dead letters", n)
	}
	t.Logf("cycle done after %s: %d store requests (%d via live1, %d via live2), %v failed at the dead proxy, healthy egresses %v",
		cycle.Round(time.Millisecond), replay.totalRequests(), live1.count(), live2.count(), deadErrors, metric("playwatch_proxy_healthy", ""))
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "egress benched") || strings.Contains(line, "egress back in service") {
			t.Log(line)
		}
	}
	if err := stop(); err != nil {
		t.Errorf("run: %v\n%s", err, logs)
	}
	t.Logf("took %s", time.Since(began).Round(time.Millisecond))
}
