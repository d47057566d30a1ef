package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// forwardProxy is a real HTTP forward proxy for plain-http targets: it
// receives absolute-form requests and relays them, marking them with Via.
// It can answer a status itself instead (a throttled exit IP) and hold each
// request for a while. Requests count as in flight while held: that window
// lies inside the client's lease, so the count never overstates the
// client's concurrency.
type forwardProxy struct {
	*httptest.Server
	name string

	mu          sync.Mutex
	status      int           // when set, answered instead of relaying
	delay       time.Duration // held before relaying
	requests    int
	inFlight    int
	maxInFlight int
	starts      []time.Time
}

func newForwardProxy(t testing.TB, name string) *forwardProxy {
	t.Helper()
	p := &forwardProxy{name: name}
	transport := &http.Transport{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !r.URL.IsAbs() {
			http.Error(w, "not a proxy request", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		p.requests++
		p.inFlight++
		p.maxInFlight = max(p.maxInFlight, p.inFlight)
		p.starts = append(p.starts, time.Now())
		status, delay := p.status, p.delay
		p.mu.Unlock()
		time.Sleep(delay)
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
		if status != 0 {
			http.Error(w, http.StatusText(status), status)
			return
		}
		out, err := relayedRequest(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out.Header.Set("Via", "1.1 "+p.name)
		resp, err := transport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		relayAnswer(w, resp)
	}))
	t.Cleanup(func() {
		p.Close()
		transport.CloseIdleConnections()
	})
	return p
}

// relayedRequest is r to be sent on by a test proxy, its body read in full
// first. Passing r.Body on as it is races: Go's HTTP/1 server drains and
// closes an inbound body when the answer's head goes out (golang/go#40747),
// while the upstream transport may still read it once more after its last
// byte (to check its length); it then fails the write and closes the
// upstream connection under the answer being relayed, which reached the
// client cut short with a clean chunked end.
func relayedRequest(r *http.Request) (*http.Request, error) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	if r.Body == nil || r.Body == http.NoBody {
		return out, nil
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the request body: %w", err)
	}
	out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	return out, nil
}

// relayAnswer copies resp to w. An answer that breaks off upstream breaks
// the client's connection, as a real proxy's does, rather than end as if it
// were whole.
func relayAnswer(w http.ResponseWriter, resp *http.Response) {
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		panic(http.ErrAbortHandler)
	}
}

func (p *forwardProxy) setStatus(status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status = status
}

func (p *forwardProxy) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests
}

// stats returns the request count, the most requests seen at once and the
// arrival times.
func (p *forwardProxy) stats() (requests, maxInFlight int, starts []time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests, p.maxInFlight, append([]time.Time(nil), p.starts...)
}

func (p *forwardProxy) host() string { return strings.TrimPrefix(p.URL, "http://") }

// getThrough sends a details request through a lease and scores the lease
// the way the client does.
func getThrough(t *testing.T, l *lease, target string) leaseOutcome {
	t.Helper()
	resp, err := l.Client().Get(target + "/store/apps/details?id=com.example.app&hl=en&gl=us")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		return outcomeThrottled
	}
	return outcomeOK
}

func acquireNow(t *testing.T, p *proxyPool) *lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestProxyHealthBenchAndRecovery(t *testing.T) {
	rs := newReplayPlayStore(t)
	a, b := newForwardProxy(t, "a"), newForwardProxy(t, "b")
	a.setStatus(http.StatusTooManyRequests)
	clk := newFakeClock(false)
	reg := prometheus.NewRegistry()
	cfg := defaultProxyPoolConfig()
	cfg.Proxies, cfg.RateLimitRequests, cfg.MaxInFlight, cfg.MinGap, cfg.Clock = []string{a.URL, b.URL}, 0, 1, 0, clk
	pool, err := newProxyPool(cfg, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	healthy := func() float64 { return metricValue(t, reg, "playwatch_proxy_healthy", nil) }
	if healthy() != 2 {
		t.Fatalf("healthy %v at start", healthy())
	}
	egressOf := map[string]*forwardProxy{a.host(): a, b.host(): b}
	use := func(l *lease) string {
		l.Release(getThrough(t, l, rs.URL), nil)
		return egressOf[l.Name()].name
	}

	// With one slot each, two leases take both proxies. a answers 429.
	l1, l2 := acquireNow(t, pool), acquireNow(t, pool)
	if n1, n2 := use(l1), use(l2); n1 == n2 {
		t.Fatalf("both leases on %s", n1)
	}
	// b is now healthier (1 against 0.5): the next lease goes there.
	lb := acquireNow(t, pool)
	if lb.Name() != b.host() {
		t.Fatalf("lease on %s, want the healthier b", lb.Name())
	}
	// While b is busy, a is the only free egress; its second 429 benches it.
	if use(acquireNow(t, pool)) != "a" {
		t.Fatal("expected a")
	}
	benched := func(p *forwardProxy) float64 {
		return metricValue(t, reg, "playwatch_proxy_benched", map[string]string{"proxy": p.host()})
	}
	if healthy() != 1 || benched(a) != 1 || benched(b) != 0 {
		t.Fatalf("healthy %v, benched a %v, b %v after a was benched", healthy(), benched(a), benched(b))
	}
	// a is benched and b busy: Acquire sleeps until the bench ends (1 min)
	// or a lease comes back; b's release wakes it.
	got := make(chan *lease)
	go func() {
		l, err := pool.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	if d := clk.nextTimer(t); d != time.Minute {
		t.Fatalf("waiting %v, want until the 1m cool-down ends", d)
	}
	lb.Release(outcomeOK, nil)
	if l := <-got; l.Name() != b.host() {
		t.Fatalf("woken with %s", l.Name())
	} else {
		defer l.Release(outcomeOK, nil)
	}

	// After the cool-down, a is probed once; still 429: benched for twice as long.
	clk.Advance(time.Minute)
	probe := acquireNow(t, pool)
	if !probe.probe || use(probe) != "a" {
		t.Fatalf("expected a probe on a, got %s", probe.Name())
	}
	go func() {
		l, err := pool.Acquire(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	if d := clk.nextTimer(t); d != 2*time.Minute {
		t.Fatalf("second cool-down %v, want 2m", d)
	}
	// a recovers: the probe after the second cool-down succeeds.
	a.setStatus(0)
	clk.Advance(2 * time.Minute)
	probe = <-got
	if !probe.probe || use(probe) != "a" {
		t.Fatalf("expected a probe on a, got %s", probe.Name())
	}
	if healthy() != 2 || benched(a) != 0 {
		t.Fatalf("healthy %v, benched a %v after a recovered", healthy(), benched(a))
	}
	if n := a.count(); n != 4 {
		t.Errorf("a saw %d requests, want 4 (two 429, a failed probe, a good probe)", n)
	}
}

func TestProxyAllBenchedWaitsAndNeverGoesDirect(t *testing.T) {
	rs := newReplayPlayStore(t)
	a := newForwardProxy(t, "a")
	a.setStatus(http.StatusTooManyRequests)
	ts := newTestPlayStore(t, rs.URL, func(p *proxyPoolConfig, _ *playStoreConfig) {
		p.Proxies = []string{a.URL}
		p.Clock = newFakeClock(false)
	})
	poolClock := ts.pool.cfg.Clock.(*fakeClock)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := ts.client.Details(ctx, "com.example.app", "en", "us")
		done <- err
	}()
	// Two 429s bench the only proxy; the third attempt sleeps on the bench.
	if d := poolClock.nextTimer(t); d != time.Minute {
		t.Fatalf("pool wait %v, want the 1m cool-down", d)
	}
	if a.count() != 2 || rs.totalRequests() != 0 {
		t.Fatalf("proxy saw %d, replay server %d direct", a.count(), rs.totalRequests())
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v", err)
	}
	if rs.totalRequests() != 0 {
		t.Fatal("a request went out directly")
	}
}

func TestProxyInFlightLimitAndGap(t *testing.T) {
	rs := newReplayPlayStore(t)
	a, b := newForwardProxy(t, "a"), newForwardProxy(t, "b")
	for _, p := range []*forwardProxy{a, b} {
		p.delay = 80 * time.Millisecond
	}
	const gap = 40 * time.Millisecond
	ts := newTestPlayStore(t, rs.URL, func(p *proxyPoolConfig, _ *playStoreConfig) {
		p.Proxies = []string{a.URL, b.URL}
		p.MaxInFlight = 2
		p.MinGap = gap
		p.Clock = systemClock{}
	})
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			if _, err := ts.client.Details(context.Background(), "com.example.app"+string(rune('a'+i)), "en", "us"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, p := range []*forwardProxy{a, b} {
		requests, maxInFlight, starts := p.stats()
		// Both saturated: the split follows completion order, so about even.
		if requests < 4 {
			t.Errorf("proxy %s: %d of 12 requests, want about half", p.name, requests)
		}
		if maxInFlight != 2 {
			t.Errorf("proxy %s: at most %d in flight, want 2", p.name, maxInFlight)
		}
		// Arrival times carry scheduling noise: check the spread of them all
		// (TestProxyGapAndSlotsExact checks each gap on a fake clock).
		gaps := time.Duration(len(starts) - 1)
		if span := starts[len(starts)-1].Sub(starts[0]); span < gaps*gap*3/4 {
			t.Errorf("proxy %s: %d requests within %v, want about %d gaps of %v", p.name, len(starts), span, gaps, gap)
		}
	}
	if rs.proxiedRequests() != 12 || rs.totalRequests() != 12 {
		t.Errorf("%d of %d requests came through a proxy", rs.proxiedRequests(), rs.totalRequests())
	}
}

func TestProxyGapAndSlotsExact(t *testing.T) {
	clk := newFakeClock(false)
	cfg := defaultProxyPoolConfig()
	cfg.RateLimitRequests, cfg.MaxInFlight, cfg.MinGap, cfg.Clock = 0, 2, time.Second, clk
	pool, err := newProxyPool(cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	acquired := make(chan *lease, 3)
	acquire := func() {
		go func() {
			l, err := pool.Acquire(context.Background())
			if err != nil {
				t.Error(err)
			}
			acquired <- l
		}()
	}
	// waiting starts a request that must wait for a release, with no timer.
	waiting := func() {
		t.Helper()
		acquire()
		clk.noTimer(t)
		select {
		case <-acquired:
			t.Fatal("lease granted beyond the limit")
		default:
		}
	}
	// afterGap is the lease the waiting request (the which-th) gets once the
	// 1 s gap after the previous start has passed.
	afterGap := func(which string) *lease {
		t.Helper()
		if d := clk.nextTimer(t); d != time.Second {
			t.Fatalf("%s request waits %v, want the 1s gap", which, d)
		}
		clk.Advance(time.Second)
		return <-acquired
	}
	// A cold egress (no answer, so no NID cookie yet) takes one request at
	// a time; the second waits for the release, with no timer.
	cold := acquireNow(t, pool)
	waiting()
	cold.Release(outcomeOK, nil)
	first := afterGap("second")
	// Warm now: two in flight, each start 1 s after the previous one.
	acquire()
	second := afterGap("third")
	// Both slots are taken: the next waits for a release, with no timer.
	waiting()
	first.Release(outcomeOK, nil)
	third := afterGap("fourth")
	second.Release(outcomeOK, nil)
	third.Release(outcomeOK, nil)
	third.Release(outcomeOK, nil) // a second release is a no-op
	if e := pool.egresses[0]; e.inFlight != 0 {
		t.Fatalf("in flight %d after all releases", e.inFlight)
	}
}

func TestProxyCookieJarPerEgressAndStickyPaging(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("com.example.app", replayApp{Reviews: 1000})
	a, b := newForwardProxy(t, "a"), newForwardProxy(t, "b")
	ts := newTestPlayStore(t, rs.URL, func(p *proxyPoolConfig, _ *playStoreConfig) {
		p.Proxies = []string{a.URL, b.URL}
		p.MaxInFlight = 1
	})
	ctx := context.Background()
	for range 6 {
		if _, err := ts.client.Details(ctx, "com.example.app", "en", "us"); err != nil {
			t.Fatal(err)
		}
	}
	// One NID per egress: each jar keeps its own cookie (a shared jar would
	// have got one, no jar six).
	if a.count() != 3 || b.count() != 3 || rs.nidsIssued() != 2 {
		t.Fatalf("requests a %d b %d, NIDs issued %d", a.count(), b.count(), rs.nidsIssued())
	}
	// The replay server, like Google, rejects a continuation token sent with
	// another NID: paging only works when every page takes the same egress.
	before := a.count() + b.count()
	got, err := ts.client.Reviews(ctx, "com.example.app", "en", "us", 1000, nil)
	if err != nil || len(got) != 1000 {
		t.Fatalf("%d reviews, %v", len(got), err)
	}
	if pages := a.count() + b.count() - before; pages != 7 {
		t.Errorf("%d requests for 7 pages (a continuation on the wrong egress fails)", pages)
	}
}

func TestProxyDirectEgressKeepsItsCookie(t *testing.T) {
	rs := newReplayPlayStore(t)
	ts := newTestPlayStore(t, rs.URL, nil)
	for range 5 {
		if _, err := ts.client.Details(context.Background(), "com.example.app", "en", "us"); err != nil {
			t.Fatal(err)
		}
	}
	if rs.nidsIssued() != 1 {
		t.Fatalf("%d NIDs issued to one egress, want 1", rs.nidsIssued())
	}
}

func TestProxyConfigErrorsHideCredentials(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := defaultProxyPoolConfig()
	cfg.Proxies = []string{"ftp://user:secret@proxy.example:21"}
	_, err := newProxyPool(cfg, reg, slog.New(slog.DiscardHandler))
	if err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("error %v", err)
	}
	cfg.Proxies = []string{"http://user:secret@proxy.example:3128"}
	pool, err := newProxyPool(cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if name := pool.egresses[0].name; name != "proxy.example:3128" {
		t.Fatalf("metrics label %q", name)
	}
}

// The cool-down doubles up to its cap and stays there, however long an
// egress keeps failing.
func TestProxyBenchCooldownDoublesToItsCap(t *testing.T) {
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 16 * time.Minute, 30 * time.Minute}
	for benches := range 100 {
		got := benchCooldown(time.Minute, 30*time.Minute, benches)
		if w := want[min(benches, len(want)-1)]; got != w {
			t.Fatalf("cool-down after %d benches = %v, want %v", benches, got, w)
		}
	}
}

// A request that waits for a benched egress until its time runs out says
// what benched it (here: nothing listens where the store should be), not
// only that the deadline passed.
func TestProxyWaitNamesWhatBenchedTheEgress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ts := newTestPlayStore(t, "http://"+addr, func(p *proxyPoolConfig, c *playStoreConfig) {
		p.Clock = systemClock{}
		p.FailureFactor = 0.1 // the first failure benches the egress
		c.Retries = 0
	})
	if _, err := ts.client.Details(context.Background(), "com.example.app", "en", "us"); !errors.Is(err, errNetwork) {
		t.Fatalf("details: %v, want a network error", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = ts.client.Reviews(ctx, "com.example.app", "en", "us", 10, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "direct benched until") || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("reviews: %v, want the deadline and the connection error that benched the direct egress", err)
	}
}
