package main

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// readinessCheck is one dependency /readyz asks about.
type readinessCheck struct {
	name  string
	check func(context.Context) error
}

// readinessNote is what a check returns to show a line on /readyz without
// making the process unready.
type readinessNote string

func (n readinessNote) Error() string { return string(n) }

// newHTTPHandler serves /healthz, /readyz, /metrics and, when the registry
// role runs, the registry API and the status page with its per-app gauges,
// all instrumented.
func newHTTPHandler(reg *prometheus.Registry, hm *httpMetrics, api *registryAPI, status *statusPage, checks []readinessCheck) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		code, status, results := http.StatusOK, "ready", map[string]string{}
		for _, c := range checks {
			results[c.name] = "ok"
			if err := c.check(ctx); err != nil {
				results[c.name] = err.Error()
				if _, note := err.(readinessNote); !note {
					code, status = http.StatusServiceUnavailable, "not ready"
				}
			}
		}
		writeJSON(w, code, map[string]any{"status": status, "checks": results})
	})
	var metrics prometheus.Gatherer = reg
	if status != nil {
		metrics = prometheus.Gatherers{reg, status.gauges}
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{Registry: reg}))
	// Without these the catch-all below would answer another method with 404.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		mux.HandleFunc(p, methodNotAllowed("GET"))
	}
	if api != nil {
		api.register(mux)
	}
	if status != nil {
		status.register(mux)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
	})
	return hm.wrap(mux)
}

// newHTTPServer has timeouts on every phase so a slow client cannot hold
// a connection forever.
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
}
