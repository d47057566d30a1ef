package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// apiRoutes is an API that adds its routes to the server's mux.
type apiRoutes interface{ register(routeMux) }

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
// all instrumented, and the routes of more APIs (the notifier's). A
// handler's panic is logged on logger (run's, which redacts).
func newHTTPHandler(reg *prometheus.Registry, hm *httpMetrics, api *registryAPI, status *statusPage, checks []readinessCheck, logger *slog.Logger, more ...apiRoutes) http.Handler {
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
				if note := readinessNote(""); !errors.As(err, &note) {
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
	for _, m := range more {
		m.register(mux)
	}
	if status != nil {
		status.register(mux)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
	})
	return hm.wrap(recoverPanics(mux, logger))
}

// recoverPanics answers a request whose handler panicked with 500 and logs
// the panic with its stack: one bad input never takes the process down, nor
// leaves its client without an answer (net/http alone would drop the
// connection); inside hm.wrap, so the 500 is counted and timed like any
// answer. A panic after the answer began aborts the connection, so the
// client sees a cut answer rather than a whole one.
func recoverPanics(next *http.ServeMux, logger *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pw := &answerWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			logger.Error("HTTP handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if pw.wrote {
				panic(http.ErrAbortHandler)
			}
			writeError(w, http.StatusInternalServerError, "internal error: the server log says what failed")
		}()
		next.ServeHTTP(pw, r)
	})
}

// answerWriter notes what a handler answered so far: the status code of its
// last WriteHeader (httpMetrics.wrap counts it) and whether the answer has
// begun (recoverPanics can then no longer answer 500).
type answerWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (a *answerWriter) WriteHeader(code int) {
	a.code, a.wrote = code, true
	a.ResponseWriter.WriteHeader(code)
}

func (a *answerWriter) Write(b []byte) (int, error) {
	a.wrote = true
	return a.ResponseWriter.Write(b)
}

func (a *answerWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

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
