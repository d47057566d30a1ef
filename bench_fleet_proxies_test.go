package main

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The fleet benchmark's outside world (bench_fleet_test.go): the replay Play
// Store with tens of thousands of apps, and 500 HTTP forward proxies on
// loopback ports that behave like exit IPs in front of Google, all served by
// the benchmark's own process.

// proxyProfile is how one proxy of the benchmark behaves.
type proxyProfile int

const (
	proxyHealthy    proxyProfile = iota // 50–300 ms
	proxyThrottling                     // 50–300 ms, 429 on benchThrottleShare of its requests
	proxySlow                           // 2–5 s
	proxyDead                           // connection refused
)

const (
	// benchProxyGap is Google's budget per exit IP: a request that comes
	// sooner after the previous one, or while another is in flight, gets
	// 429 and counts as a budget violation.
	benchProxyGap      = 1500 * time.Millisecond
	benchThrottleShare = 0.3
)

// benchProfiles spreads n proxies over the profiles (90 % healthy,
// 6 % throttling, 3 % slow, 1 % dead) in a shuffled order, so that each
// server's share of them holds every profile.
func benchProfiles(n int, rng *rand.Rand) []proxyProfile {
	out := make([]proxyProfile, n)
	throttling, slow, dead := n*6/100, n*3/100, max(n/100, 1)
	i := 0
	for _, c := range []struct {
		p proxyProfile
		n int
	}{{proxyThrottling, throttling}, {proxySlow, slow}, {proxyDead, dead}} {
		for range c.n {
			out[i] = c.p
			i++
		}
	}
	rng.Shuffle(n, func(a, b int) { out[a], out[b] = out[b], out[a] })
	return out
}

// benchProxy is one exit IP.
type benchProxy struct {
	URL     string
	profile proxyProfile

	mu         sync.Mutex
	inFlight   int
	lastArrive time.Time
	violations int // of them:
	overlaps   int // while another request was in flight
	minGap     time.Duration
	throttled  int
}

// benchProxies are the benchmark's proxies and what they measured.
type benchProxies struct {
	all   []*benchProxy
	began time.Time

	mu        sync.Mutex
	latencies []float32 // seconds, arrival to last byte, of relayed 200s
}

// violations sums the budget violations, those of them that overlapped
// another request, and the shortest gap between two arrivals on a proxy.
func (ps *benchProxies) violations() (n, overlaps int, minGap time.Duration) {
	minGap = time.Hour
	for _, p := range ps.all {
		p.mu.Lock()
		n += p.violations
		overlaps += p.overlaps
		if p.minGap > 0 {
			minGap = min(minGap, p.minGap)
		}
		p.mu.Unlock()
	}
	return n, overlaps, minGap
}

// latencyQuantiles returns the p50, p95 and p99 of the relayed 200s.
func (ps *benchProxies) latencyQuantiles() (p50, p95, p99 time.Duration) {
	ps.mu.Lock()
	l := slices.Clone(ps.latencies)
	ps.mu.Unlock()
	if len(l) == 0 {
		return
	}
	slices.Sort(l)
	q := func(f float64) time.Duration {
		return time.Duration(float64(l[min(int(f*float64(len(l))), len(l)-1)]) * float64(time.Second))
	}
	return q(0.50), q(0.95), q(0.99)
}

// startBenchProxies serves the proxies, relaying to the store at upstream.
func startBenchProxies(t *testing.T, profiles []proxyProfile, seed uint64) *benchProxies {
	t.Helper()
	ps := &benchProxies{began: time.Now()}
	transport := &http.Transport{MaxIdleConnsPerHost: 1000, MaxIdleConns: 1000}
	t.Cleanup(transport.CloseIdleConnections)
	for i, prof := range profiles {
		p := &benchProxy{profile: prof}
		ps.all = append(ps.all, p)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p.URL = "http://" + ln.Addr().String()
		if prof == proxyDead {
			// A port that was just free and is closed again: refused.
			ln.Close()
			continue
		}
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		var rngMu sync.Mutex
		draw := func(lo, hi time.Duration) time.Duration {
			rngMu.Lock()
			defer rngMu.Unlock()
			return lo + time.Duration(rng.Int64N(int64(hi-lo)))
		}
		throttle := func() bool {
			rngMu.Lock()
			defer rngMu.Unlock()
			return rng.Float64() < benchThrottleShare
		}
		srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			arrived := time.Now()
			if !r.URL.IsAbs() {
				http.Error(w, "not a proxy request", http.StatusBadRequest)
				return
			}
			p.mu.Lock()
			gap := arrived.Sub(p.lastArrive)
			if !p.lastArrive.IsZero() && (p.minGap == 0 || gap < p.minGap) {
				p.minGap = gap
			}
			violation := p.inFlight > 0 || (!p.lastArrive.IsZero() && gap < benchProxyGap)
			p.lastArrive = arrived
			if violation {
				p.violations++
				if p.inFlight > 0 {
					p.overlaps++
				}
			}
			p.inFlight++
			p.mu.Unlock()
			// The request leaves the proxy with its last byte written.
			var doneOnce sync.Once
			done := func() {
				doneOnce.Do(func() {
					p.mu.Lock()
					p.inFlight--
					p.mu.Unlock()
				})
			}
			defer done()
			if violation {
				http.Error(w, "Too Many Requests", http.StatusTooManyRequests)
				return
			}
			delay := draw(50*time.Millisecond, 300*time.Millisecond)
			if prof == proxySlow {
				delay = draw(2*time.Second, 5*time.Second)
			}
			select {
			case <-time.After(delay):
			case <-r.Context().Done(): // the client gave up: no longer in flight
				return
			}
			if prof == proxyThrottling && throttle() {
				p.mu.Lock()
				p.throttled++
				p.mu.Unlock()
				http.Error(w, "Too Many Requests", http.StatusTooManyRequests)
				return
			}
			out, err := relayedRequest(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			resp, err := transport.RoundTrip(out)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			relayAnswer(w, resp) // a broken answer ends the handler here
			done()
			if resp.StatusCode != http.StatusOK {
				return
			}
			ps.mu.Lock()
			ps.latencies = append(ps.latencies, float32(time.Since(arrived).Seconds()))
			ps.mu.Unlock()
		})}}
		srv.Start()
		t.Cleanup(srv.Close)
	}
	return ps
}

// benchStore is the replay Play Store at fleet scale: listings written from
// the template split at the package name (35,000 apps of 1.2 MB each cannot
// be cached, and a copy per request would be the store's whole CPU), reviews
// by the replay store's own handler. It counts its answers per second and
// keeps when each app's listing was served.
type benchStore struct {
	*httptest.Server
	replay *replayPlayStore
	began  time.Time
	parts  [][]byte // the template around each occurrence of its package

	perSecond [4096]atomic.Int64 // answers, by second since began
	okPerSec  [4096]atomic.Int64 // 200s
	mu        sync.Mutex
	listings  map[string][]int32 // package -> seconds since began of each 200 listing
}

func newBenchStore(t *testing.T, replay *replayPlayStore) *benchStore {
	s := &benchStore{replay: replay, began: time.Now(), listings: map[string][]int32{},
		parts: bytes.Split(replay.template, []byte(replayTemplatePackage))}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /store/apps/details", s.serveDetails)
	mux.HandleFunc("POST /_/PlayStoreUi/data/batchexecute", replay.serveReviews)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &answerWriter{ResponseWriter: w, code: http.StatusOK}
		mux.ServeHTTP(rec, r)
		sec := min(int(time.Since(s.began)/time.Second), len(s.perSecond)-1)
		s.perSecond[sec].Add(1)
		if rec.code == http.StatusOK {
			s.okPerSec[sec].Add(1)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *benchStore) serveDetails(w http.ResponseWriter, r *http.Request) {
	pkg := detailsPackage(w, r)
	if pkg == "" {
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	for i, part := range s.parts {
		if i > 0 {
			if _, err := io.WriteString(w, pkg); err != nil {
				return
			}
		}
		if _, err := w.Write(part); err != nil {
			return
		}
	}
	s.mu.Lock()
	s.listings[pkg] = append(s.listings[pkg], int32(time.Since(s.began)/time.Second))
	s.mu.Unlock()
}

// answers sums the answers (all, 200s) of seconds [from, to).
func (s *benchStore) answers(from, to int) (all, ok int64) {
	for i := max(from, 0); i < min(to, len(s.perSecond)); i++ {
		all += s.perSecond[i].Load()
		ok += s.okPerSec[i].Load()
	}
	return all, ok
}

// crawledTwice counts the apps whose listing was served more than once
// between two of the cycle starts (seconds since began; the last cycle runs
// to the end), and those of them whose second listing was served in
// [from, to) (the takeover).
func (s *benchStore) crawledTwice(cycleStarts []int32, from, to int32) (n, inWindow int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, times := range s.listings {
		perCycle := map[int]int{}
		twice, inside := false, false
		for _, at := range times {
			c, _ := slices.BinarySearch(cycleStarts, at+1)
			perCycle[c]++
			if perCycle[c] > 1 {
				twice = true
				inside = inside || (at >= from && at < to)
			}
		}
		if twice {
			n++
			if inside {
				inWindow++
			}
		}
	}
	return n, inWindow
}
