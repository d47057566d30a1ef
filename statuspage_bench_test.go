package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkStatusPage renders the overview and one app's page over HTTP on
// 1M stored reviews: 50 apps with 20,000 reviews each over 90 days and an
// hourly listing for 90 days (108,000 app_stats rows). The goal is under
// 200 ms a page (reading the rollups: overview 109 ms, app page 93 ms on a
// shared 2-core machine); `-benchtime 1x` checks that it runs (the data takes a
// minute or so to load). "gauges refresh" is the per-app gauges' background
// read; "metrics" serves its result.
func BenchmarkStatusPage(b *testing.B) {
	pool := newTestPool(b)
	seedStatus(b, pool)
	seedStatusVolume(b, pool, 50, 20000, 90*24, statusNow, 90*24*time.Hour)
	page := newStatusPage(statusDB{pool}, newMetricsRegistry("bench"), "", time.Hour, 30*time.Second, 4, testLogger(b))
	page.locales = testLocales
	page.now = func() time.Time { return statusNow }
	srv := httptest.NewServer(newHTTPHandler(newMetricsRegistry("bench"), newHTTPMetrics(newMetricsRegistry("bench")), nil, page, nil, page.logger))
	b.Cleanup(srv.Close)
	b.Run("gauges refresh", func(b *testing.B) {
		for b.Loop() {
			page.appGauges.refresh(b.Context())
		}
		if !page.appGauges.ok {
			b.Fatal("the per-app gauges could not be read")
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/refresh")
	})
	for _, bc := range []struct{ name, path string }{
		{"overview", "/"},
		{"app", "/apps/com.example.bulk7"},
		{"metrics", "/metrics"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				resp, err := http.Get(srv.URL + bc.path)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("%s: %d", bc.path, resp.StatusCode)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/page")
		})
	}
}
