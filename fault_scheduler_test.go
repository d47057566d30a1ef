package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 20 item 3 with a real kill: the appliance's new-app watch crawls an
// app registered mid-cycle, the appliance is killed with SIGKILL (no
// resignation: the next start waits for the lease to expire), and the next
// start, leading on the same data directory, does not crawl it again before
// the next planned cycle: the store sees one listing request for it.
func TestFaultNewAppCrawledOnceAcrossLeaderKill(t *testing.T) {
	requireFaultSuite(t)
	bin := buildPlaywatch(t)
	replay := newReplayPlayStore(t)
	logPath := filepath.Join(t.TempDir(), "playwatch.log")
	env := managedApplianceEnv(t, filepath.Join(tempDataDir(t), "data"), map[string]string{
		"PLAYSTORE_URL":       replay.URL,
		"RATE_LIMIT_REQUESTS": "0",
		"EGRESS_MIN_GAP":      "0s",
		"REVIEWS_PER_APP":     "10",
		"CRAWL_INTERVAL":      "1h",
		"CRAWL_NEW_APP_CHECK": "500ms",
		"SCHEDULER_LEASE":     "6s",
	})
	logApplianceOnFailure(t, logPath, 60)
	register := func(a *appliance, pkg string) {
		t.Helper()
		replay.setApp(pkg, replayApp{Reviews: 10})
		registerOverHTTP(t, a.base, pkg)
	}
	const planned, late = "com.example.planned", "com.example.late"
	a := startAppliance(t, bin, env, logPath)
	register(a, planned) // the first app starts cycle 1
	waitFor(t, time.Minute, "cycle 1", func() bool { return a.metric(t, "playwatch_crawl_cycles_total", "") == 1 })
	register(a, late)
	waitFor(t, time.Minute, "the new-app watch's crawl", func() bool {
		return a.metric(t, "playwatch_crawl_new_apps_total", "") == 1 && a.metric(t, "playwatch_crawl_jobs_done_total", "") == 2
	})
	if err := a.stop(t, syscall.SIGKILL, 30*time.Second); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the appliance exited with %v, want killed", err)
	}
	a = startAppliance(t, bin, env, logPath)
	waitFor(t, time.Minute, "the restarted appliance to lead", func() bool { return a.metric(t, "playwatch_scheduler_leader", "") == 1 })
	time.Sleep(3 * time.Second) // six looks for new apps
	for _, pkg := range []string{planned, late} {
		if n := replay.requests("details", pkg); n != 1 {
			t.Errorf("%s: %d listing requests before the next cycle, want 1", pkg, n)
		}
	}
	if n := a.metric(t, "playwatch_crawl_jobs_published_total", ""); n != 0 {
		t.Errorf("the restarted leader published %v jobs, want none before the next cycle", n)
	}
	if err := a.stop(t, syscall.SIGTERM, time.Minute); err != nil {
		t.Errorf("the appliance exited with %v after SIGTERM", err)
	}
}
