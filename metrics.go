package main

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// newMetricsRegistry is the registry /metrics serves: process and Go runtime
// collectors plus whatever each role registers on it.
func newMetricsRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewGoCollector(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "playwatch_build_info",
			Help:        "Always 1; the version label says which build runs.",
			ConstLabels: prometheus.Labels{"version": version},
		}, func() float64 { return 1 }),
	)
	return reg
}

// httpMetrics counts and times HTTP requests by route pattern and status.
type httpMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	mk := metricMaker{reg}
	m := &httpMetrics{
		requests: mk.counterVec("playwatch_http_requests_total", "HTTP requests served, by route pattern and status code.", "route", "code"),
		latency:  mk.histogramVec("playwatch_http_request_duration_seconds", "Time to serve an HTTP request, by route pattern.", prometheus.ExponentialBuckets(0.0005, 2, 16), "route"),
	}
	return m
}

// wrap instruments a ServeMux (below recoverPanics): the mux stores the
// matched pattern in the request, so it is known once the handler returns.
func (m *httpMetrics) wrap(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &answerWriter{ResponseWriter: w, code: http.StatusOK}
		mux.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		m.requests.WithLabelValues(route, strconv.Itoa(rec.code)).Inc()
		m.latency.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}
