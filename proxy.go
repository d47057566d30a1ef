package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// proxyPoolConfig tunes the egresses. Start from defaultProxyPoolConfig;
// tests shrink the durations and inject Clock and Random.
type proxyPoolConfig struct {
	// Proxies are proxy URLs (config PROXIES); none means one direct egress.
	Proxies []string
	// RateLimitRequests per RateLimitPeriod is each egress's token bucket
	// (config RATE_LIMIT_REQUESTS, RATE_LIMIT_PERIOD); 0 requests = unlimited.
	RateLimitRequests int
	RateLimitPeriod   time.Duration

	MaxInFlight    int           // concurrent requests per egress
	MinGap         time.Duration // between request starts on one egress; 0: none
	BenchThreshold float64       // health score below which an egress is benched
	SuccessStep    float64       // score added by a success (the score caps at 1)
	FailureFactor  float64       // score multiplier on a 429, timeout or network error
	BaseCooldown   time.Duration // first bench; doubles on each bench in a row
	MaxCooldown    time.Duration
	// MaxWait, when set, is the longest Acquire waits for a bench to end:
	// with every egress benched for longer it fails at once with a
	// *benchWaitError. 0 (the crawler) waits out any bench; playwatch fetch
	// sets its --max-wait.
	MaxWait time.Duration

	ConnectTimeout time.Duration // TCP and TLS handshake
	HeaderTimeout  time.Duration // request sent to response headers
	RequestTimeout time.Duration // the whole exchange, body included

	Clock  clock
	Random func() float64
}

// defaultProxyPoolConfig is one direct egress with the settings' defaults
// (RATE_LIMIT_*, EGRESS_*) and the health rules of the pool.
func defaultProxyPoolConfig() proxyPoolConfig {
	return proxyPoolConfig{
		RateLimitRequests: 10,
		RateLimitPeriod:   time.Minute,
		MaxInFlight:       2,
		MinGap:            time.Second,
		BenchThreshold:    0.3,
		SuccessStep:       0.1,
		FailureFactor:     0.5,
		BaseCooldown:      time.Minute,
		MaxCooldown:       30 * time.Minute,
		ConnectTimeout:    10 * time.Second,
		HeaderTimeout:     20 * time.Second,
		RequestTimeout:    60 * time.Second,
		Clock:             systemClock{},
		Random:            rand.Float64,
	}
}

// leaseOutcome is what a request through a lease says about its egress.
type leaseOutcome int

const (
	outcomeOK        leaseOutcome = iota // an answer came (404 included): the egress works
	outcomeThrottled                     // 429, 503, captcha or consent page
	outcomeFailed                        // network error, timeout, 5xx
	outcomeNeutral                       // canceled, or an answer that says nothing about the egress
)

// egress is one way out to the Play Store: a proxy or the direct route, with
// its own connections, cookie jar, token bucket and health.
type egress struct {
	name   string // "direct" or the proxy's host:port (never its credentials)
	client *http.Client
	bucket *tokenBucket

	// Guarded by proxyPool.mu.
	score        float64   // health in [0, 1]
	inFlight     int       // leases out
	nextStart    time.Time // earliest start of the next request (min gap)
	lastLeased   uint64    // lease sequence number: spreads work over equal egresses
	benchedUntil time.Time // zero while in service
	benches      int       // benches in a row; the cool-down doubles with each
	benchCause   error     // the failure that benched it, for whoever waits
	probing      bool      // the one lease allowed after a cool-down is out
	// warm: an answer came back, so the jar holds Google's NID cookie.
	// Until then one request at a time, or concurrent first answers would
	// each set a different NID and strand the paging tokens minted with the
	// others.
	warm bool
}

// proxyPool hands out leases on its egresses: the healthiest one with a free
// slot, never one on the bench. When all are benched or busy, Acquire waits.
type proxyPool struct {
	cfg      proxyPoolConfig
	log      *slog.Logger
	egresses []*egress

	healthy       prometheus.Gauge
	benched       *prometheus.GaugeVec
	tokenWaits    *prometheus.CounterVec
	tokenWaitTime *prometheus.CounterVec

	mu      sync.Mutex
	changed chan struct{} // closed and replaced whenever an egress frees up
	leases  uint64        // leases handed out so far
}

// lease is the right to send one request through one egress.
type lease struct {
	pool     *proxyPool
	egress   *egress
	probe    bool
	released bool // guarded by pool.mu
}

// newProxyPool builds one egress per proxy, or a single direct one.
func newProxyPool(cfg proxyPoolConfig, reg prometheus.Registerer, log *slog.Logger) (*proxyPool, error) {
	mk := metricMaker{} // registered below: a clash is an error, not a panic
	p := &proxyPool{
		cfg:           cfg,
		log:           log,
		changed:       make(chan struct{}),
		healthy:       mk.gauge("playwatch_proxy_healthy", "Egresses (proxies, or the direct route) in service, not benched."),
		benched:       mk.gaugeVec("playwatch_proxy_benched", "1 while the egress is benched (after a cool-down, until a probe succeeds), else 0.", "proxy"),
		tokenWaits:    mk.counterVec("playwatch_ratelimit_waits_total", "Requests that had to wait for a rate-limit token.", "proxy"),
		tokenWaitTime: mk.counterVec("playwatch_ratelimit_wait_seconds_total", "Time spent waiting for rate-limit tokens.", "proxy"),
	}
	for _, c := range []prometheus.Collector{p.healthy, p.benched, p.tokenWaits, p.tokenWaitTime} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering proxy pool metrics: %w", err)
		}
	}
	routes := cfg.Proxies
	if len(routes) == 0 {
		routes = []string{""}
	}
	for _, raw := range routes {
		e := &egress{name: "direct", score: 1,
			bucket: newTokenBucket(cfg.RateLimitRequests, cfg.RateLimitPeriod, cfg.Clock, cfg.Random)}
		var proxyURL *url.URL
		if raw != "" {
			u, err := parseProxyURL(raw)
			if err != nil {
				return nil, err
			}
			proxyURL, e.name = u, u.Host
		}
		e.client = newEgressClient(proxyURL, cfg)
		p.egresses = append(p.egresses, e)
		p.benched.WithLabelValues(e.name).Set(0)
	}
	p.healthy.Set(float64(len(p.egresses)))
	return p, nil
}

func parseProxyURL(raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil, fmt.Errorf("proxy %q: %w", redactProxy(raw), err)
	}
	switch u.Scheme {
	case "http", "https", "socks5":
	default:
		return nil, fmt.Errorf("proxy %q: scheme must be http, https or socks5", u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("proxy %q: no host", u.Redacted())
	}
	return u, nil
}

// redactProxy hides credentials in a proxy string that did not even parse.
func redactProxy(raw string) string {
	if at := strings.LastIndex(raw, "@"); at >= 0 {
		return "***" + raw[at:]
	}
	return raw
}

// newEgressClient gives each egress its own connections and cookie jar:
// Google pins review paging to the backend named in the NID cookie, and a
// cookie set through one IP means nothing through another.
func newEgressClient(proxy *url.URL, cfg proxyPoolConfig) *http.Client {
	jar, _ := cookiejar.New(nil) // never fails without options
	transport := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   cfg.ConnectTimeout,
		ResponseHeaderTimeout: cfg.HeaderTimeout,
		MaxIdleConnsPerHost:   cfg.MaxInFlight,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	if proxy != nil {
		transport.Proxy = http.ProxyURL(proxy)
	}
	return &http.Client{
		Transport:     transport,
		Jar:           jar,
		Timeout:       cfg.RequestTimeout,
		CheckRedirect: stopAtBlockPage,
	}
}

// Acquire waits for a lease on the healthiest egress with a free slot, then
// for that egress's rate-limit token and minimum gap. It never spins: it
// sleeps until a lease is released or a bench ends, or ctx ends.
func (p *proxyPool) Acquire(ctx context.Context) (*lease, error) {
	return p.AcquireSame(ctx, nil)
}

// AcquireSame is Acquire keeping to the egress prev (if not nil) while it is
// in service, waiting for it when busy: a reviews continuation token belongs
// to the NID cookie in that egress's jar.
func (p *proxyPool) AcquireSame(ctx context.Context, prev *egress) (*lease, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		p.mu.Lock()
		now := p.cfg.Clock.Now()
		e, probe, wakeAt := p.pick(now, prev)
		changed := p.changed
		if e != nil {
			e.inFlight++
			p.leases++
			e.lastLeased = p.leases
			e.probing = e.probing || probe
			p.mu.Unlock()
			l := &lease{pool: p, egress: e, probe: probe}
			if err := p.pace(ctx, e); err != nil {
				l.Release(outcomeNeutral, nil)
				return nil, err
			}
			return l, nil
		}
		if err := p.benchTooLong(now, wakeAt); err != nil {
			p.mu.Unlock()
			return nil, err
		}
		p.mu.Unlock()
		if err := p.waitForChange(ctx, changed, wakeAt.Sub(now)); err != nil {
			return nil, p.benchedError(err)
		}
	}
}

// benchedError adds to err, the end of a wait for an egress, what benched
// the egresses that are benched: the cause a caller wants to read, where
// err alone says only that its time ran out.
func (p *proxyPool) benchedError(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	be := &egressBenchedError{err: err, At: p.cfg.Clock.Now()}
	for _, e := range p.egresses {
		if !e.benchedUntil.IsZero() && e.benchCause != nil {
			be.Benched = append(be.Benched, benchedEgress{Name: e.name, Until: e.benchedUntil, Cause: e.benchCause})
		}
	}
	if len(be.Benched) == 0 {
		return err
	}
	return be
}

// egressBenchedError is a wait for an egress that ended (its time ran out)
// while egresses were benched; the crawl outcome names the bench.
type egressBenchedError struct {
	err     error
	At      time.Time
	Benched []benchedEgress
}

func (e *egressBenchedError) Error() string {
	parts := make([]string, len(e.Benched))
	for i, b := range e.Benched {
		parts[i] = b.describe(e.At)
	}
	return fmt.Sprintf("%v; %s", e.err, strings.Join(parts, "; "))
}

func (e *egressBenchedError) Unwrap() error { return e.err }

// benchWaitError is Acquire declining to wait: every egress is benched for
// longer than MaxWait. It says which, until when and after what.
type benchWaitError struct {
	MaxWait time.Duration
	At      time.Time // when Acquire declined
	Benched []benchedEgress
}

type benchedEgress struct {
	Name  string
	Until time.Time // end of the cool-down
	Cause error     // the failure that benched it
}

func (e *benchWaitError) Error() string {
	parts := make([]string, len(e.Benched))
	for i, b := range e.Benched {
		parts[i] = b.describe(e.At)
	}
	return fmt.Sprintf("every egress is benched for longer than the longest wait allowed (%v): %s", e.MaxWait, strings.Join(parts, "; "))
}

// describe says, as of now, until when the egress is benched and why.
func (b benchedEgress) describe(now time.Time) string {
	s := fmt.Sprintf("%s benched until %s", b.Name, b.Until.Format(time.TimeOnly))
	if left := b.Until.Sub(now); left > 0 {
		s += fmt.Sprintf(" (in %v)", left.Round(time.Second))
	} else {
		s += " (cool-down over, a probe decides)"
	}
	if b.Cause != nil {
		s += fmt.Sprintf(" after: %v", b.Cause)
	}
	return s
}

// benchTooLong returns a *benchWaitError when MaxWait is set, every egress
// is on the bench and the first cool-down ends more than MaxWait after now
// (wakeAt, from pick). An egress in service or probing can free up sooner,
// so its wait is not refused. The caller holds p.mu.
func (p *proxyPool) benchTooLong(now, wakeAt time.Time) error {
	if p.cfg.MaxWait <= 0 || wakeAt.IsZero() || wakeAt.Sub(now) <= p.cfg.MaxWait {
		return nil
	}
	err := &benchWaitError{MaxWait: p.cfg.MaxWait, At: now}
	for _, e := range p.egresses {
		if !now.Before(e.benchedUntil) {
			return nil
		}
		err.Benched = append(err.Benched, benchedEgress{Name: e.name, Until: e.benchedUntil, Cause: e.benchCause})
	}
	return err
}

// pick chooses an egress; with none free it returns the time the next bench
// ends (zero if none is benched: only a release can help then).
func (p *proxyPool) pick(now time.Time, prefer *egress) (best *egress, probe bool, wakeAt time.Time) {
	if prefer != nil && prefer.benchedUntil.IsZero() {
		if prefer.inFlight < prefer.capacity(p.cfg.MaxInFlight) {
			return prefer, false, time.Time{}
		}
		return nil, false, time.Time{}
	}
	for _, e := range p.egresses {
		switch {
		case now.Before(e.benchedUntil):
			if wakeAt.IsZero() || e.benchedUntil.Before(wakeAt) {
				wakeAt = e.benchedUntil
			}
		case !e.benchedUntil.IsZero():
			// Cool-down over: one probe at a time, before anything else, so
			// that a recovered egress returns to service promptly.
			if !e.probing && e.inFlight == 0 {
				return e, true, time.Time{}
			}
		case e.inFlight < e.capacity(p.cfg.MaxInFlight) && (best == nil || better(e, best)):
			best = e
		}
	}
	return best, false, wakeAt
}

// capacity is how many requests the egress may have in flight.
func (e *egress) capacity(maxInFlight int) int {
	if !e.warm {
		return 1
	}
	return maxInFlight
}

// better orders egresses: healthier first, then less busy, then least
// recently leased.
func better(a, b *egress) bool {
	if a.score != b.score {
		return a.score > b.score
	}
	if a.inFlight != b.inFlight {
		return a.inFlight < b.inFlight
	}
	return a.lastLeased < b.lastLeased
}

func (p *proxyPool) waitForChange(ctx context.Context, changed <-chan struct{}, d time.Duration) error {
	var timer <-chan time.Time
	if d > 0 {
		c, stop := p.cfg.Clock.NewTimer(d)
		defer stop()
		timer = c
	}
	select {
	case <-changed:
	case <-timer:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// pace waits for the egress's token and then for its minimum gap, so that
// request starts on one egress are at least MinGap apart.
func (p *proxyPool) pace(ctx context.Context, e *egress) error {
	start := p.cfg.Clock.Now()
	if err := e.bucket.Wait(ctx); err != nil {
		return fmt.Errorf("waiting for a rate-limit token of %s: %w", e.name, err)
	}
	if waited := p.cfg.Clock.Now().Sub(start); waited > 0 {
		p.tokenWaits.WithLabelValues(e.name).Inc()
		p.tokenWaitTime.WithLabelValues(e.name).Add(waited.Seconds())
	}
	p.mu.Lock()
	now := p.cfg.Clock.Now()
	slot := e.nextStart
	if slot.Before(now) {
		slot = now
	}
	e.nextStart = slot.Add(p.cfg.MinGap)
	p.mu.Unlock()
	return sleepOn(ctx, p.cfg.Clock, slot.Sub(now))
}

// Client is the HTTP client of the leased egress.
func (l *lease) Client() *http.Client { return l.egress.client }

// Name is the egress's metrics label: "direct" or the proxy's host:port.
func (l *lease) Name() string { return l.egress.name }

// Release returns the lease and scores the egress by the request's outcome.
// Releasing twice is a no-op.
func (l *lease) Release(outcome leaseOutcome, cause error) {
	p, e := l.pool, l.egress
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.released {
		return
	}
	l.released = true
	e.inFlight--
	if l.probe {
		e.probing = false
	}
	now := p.cfg.Clock.Now()
	switch outcome {
	case outcomeOK:
		e.warm = true
		if l.probe {
			// Back in service halfway to full health: failing again soon
			// benches it for twice as long.
			e.benchedUntil, e.benchCause = time.Time{}, nil
			e.score = (p.cfg.BenchThreshold + 1) / 2
			p.log.Info("egress back in service", "proxy", e.name)
		} else {
			e.score = min(1, e.score+p.cfg.SuccessStep)
		}
		if e.score >= 1 {
			e.benches = 0
		}
	case outcomeThrottled, outcomeFailed:
		e.score *= p.cfg.FailureFactor
		if l.probe || (e.benchedUntil.IsZero() && e.score < p.cfg.BenchThreshold) {
			cooldown := benchCooldown(p.cfg.BaseCooldown, p.cfg.MaxCooldown, e.benches)
			e.benchedUntil = now.Add(cooldown)
			e.benchCause = cause
			e.benches++
			p.log.Warn("egress benched", "proxy", e.name, "score", e.score, "cooldown", cooldown,
				"until", e.benchedUntil.Format(time.TimeOnly), "benches_in_a_row", e.benches)
		}
	}
	inService := 0
	for _, x := range p.egresses {
		if x.benchedUntil.IsZero() {
			inService++
		}
	}
	p.healthy.Set(float64(inService))
	benched := 1.0
	if e.benchedUntil.IsZero() {
		benched = 0
	}
	p.benched.WithLabelValues(e.name).Set(benched)
	close(p.changed)
	p.changed = make(chan struct{})
}

// benchCooldown is base doubled once per earlier bench in a row, at most
// max; the doubling stops at max rather than overflow after hours of failure.
func benchCooldown(base, max time.Duration, benches int) time.Duration {
	d := base
	for range benches {
		if d >= max/2 {
			return max
		}
		d *= 2
	}
	return min(d, max)
}
