package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Errors of the Play Store client; callers test them with errors.Is/As.
// docs/playstore-protocol.md §4.1 maps every answer to one of them.
var (
	// errNotFound: no listing for the package in this storefront (HTTP 404).
	// Permanent: never retried.
	errNotFound = errors.New("app not found on the Play Store")
	// errRateLimited: 429 or 503. Transient.
	errRateLimited = errors.New("rate limited by the Play Store")
	// errBlocked: redirected to the captcha ("sorry") or consent page. It is
	// a kind of errRateLimited, so errors.Is(err, errRateLimited) holds too.
	errBlocked error = &subError{"blocked by a captcha or consent page", errRateLimited}
	// errUpstream: other 5xx. Transient.
	errUpstream = errors.New("backend error at the Play Store")
	// errRPCEntry: a 200 batchexecute answer carrying an error entry instead
	// of a payload; a kind of errUpstream, but no fault of the egress.
	errRPCEntry error = &subError{"error entry in a batchexecute answer", errUpstream}
	// errNetwork: connection failure, timeout or a body cut short. Transient.
	errNetwork = errors.New("network error talking to the Play Store")
	// errUnexpectedStatus: any other HTTP status. Permanent.
	errUnexpectedStatus = errors.New("unexpected HTTP status from the Play Store")
)

// subError is a sentinel error that is a kind of another sentinel.
type subError struct {
	msg  string
	kind error
}

func (e *subError) Error() string        { return e.msg }
func (e *subError) Is(target error) bool { return target == e.kind }

// statusError is an HTTP answer that is not a 200.
type statusError struct {
	Code       int
	RetryAfter time.Duration
	kind       error // one of the sentinels above
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%v (HTTP %d)", e.kind, e.Code)
}

func (e *statusError) Unwrap() error { return e.kind }

// isTransient says whether err is worth retrying: rate limiting, blocks,
// network errors, 5xx and batchexecute error entries.
func isTransient(err error) bool {
	return errors.Is(err, errRateLimited) || errors.Is(err, errUpstream) || errors.Is(err, errNetwork)
}

// errorReason maps an error to the outcome label of metrics and logs.
func errorReason(err error) string {
	var perr *parseError
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, errNotFound):
		return "not_found"
	case errors.Is(err, errRateLimited):
		return "rate_limited"
	case errors.As(err, &perr):
		return "parse_error"
	default:
		return "error"
	}
}

// locale is the hl (language) and gl (storefront country) of a request:
// a storefront of an app (JSON as the registry API gives it).
type locale struct {
	Lang    string `json:"lang"`
	Country string `json:"country"`
}

// localeDefaults picks the locale of an app: Iranian apps are read in the
// Iranian storefront, the rest in the default one (PLAYSTORE_LANG/COUNTRY,
// PLAYSTORE_IRAN_LANG/COUNTRY).
type localeDefaults struct {
	Default locale
	Iranian locale
}

func (d localeDefaults) forApp(isIranianApp bool) locale {
	if isIranianApp {
		return d.Iranian
	}
	return d.Default
}

// storefronts are the storefronts an app is read in: those it was
// registered with, else its default one (is_iranian_app and the PLAYSTORE_*
// settings), as before storefronts existed. The first is the app's first
// storefront, where a message of an older playwatch without one is stored.
func (d localeDefaults) storefronts(a app) []locale {
	if len(a.Storefronts) > 0 {
		return a.Storefronts
	}
	return []locale{d.forApp(a.IsIranianApp)}
}

// playStoreConfig tunes the client. Start from defaultPlayStoreConfig;
// tests shrink the backoff and inject Clock and Random.
type playStoreConfig struct {
	BaseURL     string        // config PLAYSTORE_URL
	UserAgent   string        // a current desktop browser's
	Retries     int           // retries of a transient error (3: four attempts)
	BackoffBase time.Duration // first retry wait, doubled on each (2 s)
	BackoffCap  time.Duration // longest wait before jitter (30 s)
	PageSize    int           // reviews per batchexecute call (150)
	MaxBody     int64         // bytes read from one answer at most
	// MaxWait, when set, is the longest wait before a retry: a longer one
	// (a backoff or a Retry-After) ends the request instead. 0 (the
	// crawler): only the caller's deadline limits it. playwatch fetch sets
	// its --max-wait, as it does the pool's.
	MaxWait time.Duration
	Clock   clock
	Random  func() float64
	// Parser reads the answers: today's parser (storeParser); a test
	// swaps in one that rejects a page, to play a layout change.
	Parser pageParser
}

// pageParser turns the body of a 200 answer into what the crawl publishes.
type pageParser interface {
	details(body []byte) (appDetails, error)
	reviews(body []byte) (reviewsPage, error)
}

// storeParser is today's parser (playstore_parse.go), for the crawl and for
// `playwatch reparse`.
type storeParser struct{}

func (storeParser) details(body []byte) (appDetails, error) { return parseDetailsPage(body) }
func (storeParser) reviews(body []byte) (reviewsPage, error) {
	return parseReviewsAnswer(body, reviewsRPC)
}

// pageArchiver keeps the body of every 200 answer before it is parsed
// (rawarchive.go). It must not keep body, whose buffer is reused, and must
// not block the crawl: an answer it cannot keep is its own failure, never
// the crawl's.
type pageArchiver interface {
	archive(ctx context.Context, p rawPage)
}

// Defaults of the client.
const (
	defaultPlayStoreURL = "https://play.google.com"
	defaultReviewCount  = 1000
	sortNewest          = 2
	// reviewsRPC is the batchexecute method the reviews request is built for
	// (docs/playstore-protocol.md §3.1); the page's own oCPfdb takes other
	// arguments.
	reviewsRPC = "UsvDTd"
)

func defaultPlayStoreConfig() playStoreConfig {
	return playStoreConfig{
		BaseURL:     defaultPlayStoreURL,
		UserAgent:   "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/138.0.0.0 Safari/537.36",
		Retries:     3,
		BackoffBase: 2 * time.Second,
		BackoffCap:  30 * time.Second,
		PageSize:    150,
		MaxBody:     16 << 20,
		Clock:       systemClock{},
		Random:      rand.Float64,
		Parser:      storeParser{},
	}
}

// playStoreClient reads app details and reviews from Google Play through the
// leases of a proxy pool, retrying transient errors with backoff.
type playStoreClient struct {
	cfg      playStoreConfig
	base     *url.URL
	pool     *proxyPool
	log      *slog.Logger
	archiver pageArchiver // nil: answers are not archived
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	parseErr *prometheus.CounterVec
}

// newPlayStoreClient registers its metrics on reg (never the global
// registry). archiver, when not nil, gets every 200 answer before it is
// parsed.
func newPlayStoreClient(cfg playStoreConfig, pool *proxyPool, archiver pageArchiver, reg prometheus.Registerer, log *slog.Logger) (*playStoreClient, error) {
	base, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("base URL of the Play Store %q is not an http(s) URL", cfg.BaseURL)
	}
	mk := metricMaker{} // registered below: a clash is an error, not a panic
	c := &playStoreClient{
		cfg:      cfg,
		base:     base,
		pool:     pool,
		log:      log,
		archiver: archiver,
		requests: mk.counterVec("playwatch_playstore_requests_total", "Play Store HTTP requests (each attempt) by outcome and egress.", "outcome", "proxy"),
		latency: mk.histogramVec("playwatch_playstore_request_duration_seconds", "Play Store request latency, answer parsed, by endpoint.",
			[]float64{0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 20, 30, 60}, "endpoint"),
		parseErr: mk.counterVec("playwatch_parse_failures_total",
			"200 answers of the Play Store that the parser could not read, by crawl path (stats, reviews) and reason (what the parser missed): a layout change shows here.",
			"path", "reason"),
	}
	for _, m := range []prometheus.Collector{c.requests, c.latency, c.parseErr} {
		if err := reg.Register(m); err != nil {
			return nil, fmt.Errorf("registering Play Store metrics: %w", err)
		}
	}
	return c, nil
}

// Details reads the app's details page.
func (c *playStoreClient) Details(ctx context.Context, pkg, lang, country string) (appDetails, error) {
	u := c.base.JoinPath("/store/apps/details")
	u.RawQuery = url.Values{"id": {pkg}, "hl": {lang}, "gl": {country}}.Encode()
	var d appDetails
	err := c.call(ctx, requestOf{pageDetails, pkg, lang, country}, nil, func(ctx context.Context) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err == nil {
			c.setHeaders(req, lang, country)
			req.Header.Set("Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
		}
		return req, err
	}, func(body []byte, at time.Time) error {
		parsed, err := parseRecovering(c.cfg.Parser.details, body)
		if err != nil {
			return err
		}
		d = parsed
		d.PackageName, d.FetchedAt = pkg, at
		return nil
	})
	if err != nil {
		return appDetails{}, fmt.Errorf("details of %s (hl=%s gl=%s): %w", pkg, lang, country, err)
	}
	return d, nil
}

// Reviews reads up to n (default 1000) of the app's newest reviews, page by
// page, deduplicated by review id. On an error after some pages it returns
// the reviews read so far together with the error; a page with a
// next-page token but no new review is such an error.
//
// stop, when not nil, is shown the new reviews of every page after which the
// paging would go on; true ends it there (the incremental crawl, docs/design.md
// "Incremental review paging"). The page it was shown is returned with the
// others.
func (c *playStoreClient) Reviews(ctx context.Context, pkg, lang, country string, n int, stop func(page []review) bool) ([]review, error) {
	if n <= 0 {
		n = defaultReviewCount
	}
	seen := make(map[string]bool)
	// The new reviews of each page, joined once at the end: appending them
	// one by one to one slice copied a thousand reviews three times over.
	var pages [][]review
	count := 0
	token := ""
	route := &egressRoute{}
	for page := 1; count < n; page++ {
		p, err := c.reviewsPage(ctx, route, pkg, lang, country, token)
		if err != nil {
			return slices.Concat(pages...), fmt.Errorf("reviews of %s (hl=%s gl=%s), page %d: %w", pkg, lang, country, page, err)
		}
		fresh := p.Reviews[:0]
		for _, r := range p.Reviews {
			if !seen[r.ReviewID] {
				seen[r.ReviewID] = true
				fresh = append(fresh, r)
			}
		}
		pages = append(pages, fresh)
		count += len(fresh)
		if p.Skipped > 0 {
			c.log.Warn("reviews without id or time skipped", "package", pkg, "page", page, "skipped", p.Skipped)
		}
		if p.NextToken != "" && len(fresh) == 0 {
			// More pages, but this one brought nothing new (its records
			// lacked an id or a time, or it repeated earlier pages, whose
			// token could loop): the read ends cut, so that no read mark
			// passes over the reviews below it.
			return slices.Concat(pages...), fmt.Errorf("reviews of %s (hl=%s gl=%s), page %d: %w", pkg, lang, country, page, c.emptyPageError(p))
		}
		if p.NextToken == "" || count >= n {
			break
		}
		if stop != nil && stop(fresh) {
			break
		}
		token = p.NextToken
	}
	out := slices.Concat(pages...)
	return out[:min(n, len(out))], nil
}

// errIncompletePaging: a reviews page with a next-page token held only
// reviews of earlier pages, so the paging would only repeat itself.
var errIncompletePaging = errors.New("incomplete paging: a page with a next-page token holds no new review")

// emptyPageError is why a page with a next-page token and no new review
// ends the paging: a parse error when its records lacked an id or a time
// (counted with the other parse failures), else errIncompletePaging.
func (c *playStoreClient) emptyPageError(p reviewsPage) error {
	if p.Skipped > 0 {
		return c.countParseFailure(pageReviews, &parseError{Path: "reviews payload [0][*] (records)", Detail: "no record with a review id and a time"})
	}
	return errIncompletePaging
}

// reviewsPage sends one batchexecute call (docs/playstore-protocol.md §3.1,
// answer read as in §3.2-3.4).
func (c *playStoreClient) reviewsPage(ctx context.Context, route *egressRoute, pkg, lang, country, token string) (reviewsPage, error) {
	var tok any // JSON null on the first page
	if token != "" {
		tok = token
	}
	args, err := json.Marshal([]any{nil, nil, []any{2, sortNewest, []any{c.cfg.PageSize, nil, tok}, nil, []any{}}, []any{pkg, 7}})
	if err != nil {
		return reviewsPage{}, fmt.Errorf("encoding reviews request: %w", err)
	}
	envelope, err := json.Marshal([][][]any{{{reviewsRPC, string(args), nil, "generic"}}})
	if err != nil {
		return reviewsPage{}, fmt.Errorf("encoding reviews request: %w", err)
	}
	form := url.Values{"f.req": {string(envelope)}}.Encode()
	u := c.base.JoinPath("/_/PlayStoreUi/data/batchexecute")
	u.RawQuery = url.Values{"hl": {lang}, "gl": {country}}.Encode()

	var page reviewsPage
	err = c.call(ctx, requestOf{pageReviews, pkg, lang, country}, route, func(ctx context.Context) (*http.Request, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), strings.NewReader(form))
		if err == nil {
			c.setHeaders(req, lang, country)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded;charset=UTF-8")
		}
		return req, err
	}, func(body []byte, at time.Time) error {
		var err error
		if page, err = parseRecovering(c.cfg.Parser.reviews, body); err != nil {
			return err
		}
		for i := range page.Reviews {
			page.Reviews[i].FetchedAt = at
		}
		return nil
	})
	return page, err
}

func (c *playStoreClient) setHeaders(req *http.Request, lang, country string) {
	req.Header.Set("User-Agent", c.cfg.UserAgent)
	req.Header.Set("Accept-Language", fmt.Sprintf("%s-%s,%s;q=0.9", lang, strings.ToUpper(country), lang))
}

// requestOf says what a request asks for: its kind (pageDetails,
// pageReviews, also the endpoint label of the metrics) and the app and
// locale, which the raw archive records with the answer.
type requestOf struct {
	kind, pkg, lang, country string
}

// call sends a request until it succeeds, fails permanently or runs out of
// retries (docs/playstore-protocol.md §4.2). Only transient errors are
// retried, after min(base·2^n, cap)·(0.5+rand), or after Retry-After when the
// server asks for longer; a wait that would outlive ctx's deadline, or last
// longer than MaxWait, is not started.
func (c *playStoreClient) call(ctx context.Context, what requestOf, route *egressRoute, newRequest func(context.Context) (*http.Request, error), parse func(body []byte, at time.Time) error) error {
	endpoint := what.kind
	for attempt := 0; ; attempt++ {
		err := c.attempt(ctx, what, route, newRequest, parse)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil || !isTransient(err):
			return err
		case attempt >= c.cfg.Retries:
			return fmt.Errorf("%w, gave up after %d attempts", err, attempt+1)
		}
		wait := c.backoff(attempt, err)
		if deadline, ok := ctx.Deadline(); ok && c.cfg.Clock.Now().Add(wait).After(deadline) {
			return fmt.Errorf("%w, gave up after %d attempts: the next in %v would pass the deadline", err, attempt+1, wait.Round(time.Millisecond))
		}
		if c.cfg.MaxWait > 0 && wait > c.cfg.MaxWait {
			// Whoever reads this also wants to know whether the egress is
			// benched, and until when.
			return c.pool.benchedError(fmt.Errorf("%w, gave up after %d attempts: the next in %v would be a longer wait than allowed (%v)", err, attempt+1, wait.Round(time.Millisecond), c.cfg.MaxWait))
		}
		c.log.Warn("Play Store request failed, retrying", "endpoint", endpoint, "attempt", attempt+1, "wait", wait, "error", err)
		if serr := sleepOn(ctx, c.cfg.Clock, wait); serr != nil {
			return fmt.Errorf("%w; retry canceled: %w", err, serr)
		}
	}
}

func (c *playStoreClient) backoff(attempt int, err error) time.Duration {
	d := min(c.cfg.BackoffBase<<min(attempt, 30), c.cfg.BackoffCap)
	d = time.Duration(float64(d) * (0.5 + c.cfg.Random()))
	var serr *statusError
	if errors.As(err, &serr) && serr.RetryAfter > d {
		d = serr.RetryAfter
	}
	return d
}

// requestTally counts the requests (every attempt) sent under a context, by
// endpoint ("details", "reviews"): the crawler's requests per app, with the
// client kept ignorant of apps and cycles.
type requestTally struct {
	mu sync.Mutex
	n  map[string]int
}

type requestTallyKey struct{}

// withRequestTally makes the client count the requests sent under ctx in t.
func withRequestTally(ctx context.Context, t *requestTally) context.Context {
	return context.WithValue(ctx, requestTallyKey{}, t)
}

func (t *requestTally) add(endpoint string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n = make(map[string]int)
	}
	t.n[endpoint]++
}

// count is the requests sent to endpoint so far.
func (t *requestTally) count(endpoint string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n[endpoint]
}

// egressRoute remembers the egress of a sequence of requests that must stay
// on it (review paging); nil means any egress will do.
type egressRoute struct{ last *egress }

// attempt sends one request through one lease and parses the answer.
func (c *playStoreClient) attempt(ctx context.Context, what requestOf, route *egressRoute, newRequest func(context.Context) (*http.Request, error), parse func(body []byte, at time.Time) error) error {
	var prev *egress
	if route != nil {
		prev = route.last
	}
	l, err := c.pool.AcquireSame(ctx, prev)
	if err != nil {
		return fmt.Errorf("waiting for an egress: %w", err)
	}
	if route != nil {
		route.last = l.egress
	}
	if t, ok := ctx.Value(requestTallyKey{}).(*requestTally); ok {
		t.add(what.kind)
	}
	start := c.cfg.Clock.Now()
	err = c.exchange(ctx, what, l, newRequest, parse)
	c.latency.WithLabelValues(what.kind).Observe(c.cfg.Clock.Now().Sub(start).Seconds())
	c.requests.WithLabelValues(errorReason(err), l.Name()).Inc()
	l.Release(leaseOutcomeOf(ctx, err), err)
	return err
}

func (c *playStoreClient) exchange(ctx context.Context, what requestOf, l *lease, newRequest func(context.Context) (*http.Request, error), parse func(body []byte, at time.Time) error) error {
	req, err := newRequest(ctx)
	if err != nil {
		return fmt.Errorf("building request: %w", err)
	}
	resp, err := l.Client().Do(req)
	if err != nil {
		return transportError(ctx, l, err)
	}
	defer resp.Body.Close()
	arrived := c.cfg.Clock.Now()
	if err := c.checkStatus(resp); err != nil {
		// Drain a little so that the connection can serve the retry.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return err
	}
	buf := bodyBuffers.Get().(*bytes.Buffer)
	defer func() {
		buf.Reset()
		bodyBuffers.Put(buf)
	}()
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, c.cfg.MaxBody+1)); err != nil {
		return transportError(ctx, l, err)
	}
	if int64(buf.Len()) > c.cfg.MaxBody {
		return c.countParseFailure(what.kind, &parseError{Path: "response body", Detail: fmt.Sprintf("larger than %d bytes", c.cfg.MaxBody)})
	}
	if c.archiver != nil {
		// Before the parse, so that a page the parser fails on is kept
		// for `playwatch reparse`.
		c.archiver.archive(ctx, rawPage{Kind: what.kind, Package: what.pkg, Lang: what.lang, Country: what.country,
			URL: req.URL.String(), Status: resp.StatusCode, FetchedAt: arrived.UTC(), CrawledAt: crawlTimeOf(ctx), Body: buf.Bytes()})
	}
	// parse must not keep the body: its buffer is reused.
	return c.countParseFailure(what.kind, parse(buf.Bytes(), arrived.UTC()))
}

// countParseFailure counts err in playwatch_parse_failures_total when it is
// a *parseError, and returns it.
func (c *playStoreClient) countParseFailure(kind string, err error) error {
	var perr *parseError
	if errors.As(err, &perr) {
		c.parseErr.WithLabelValues(crawlPathOf(kind), perr.reason()).Inc()
	}
	return err
}

// bodyBuffers recycles the buffers answers are read into: a details page is
// over 1 MB, and reading every answer into a new slice made most of the
// crawler's garbage (and GC work).
var bodyBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// transportError tells a block page and a canceled caller from a failing
// network.
func transportError(ctx context.Context, l *lease, err error) error {
	var uerr *url.Error
	switch {
	case errors.Is(err, errBlocked) && errors.As(err, &uerr):
		return uerr.Err // the redirect policy's own error says it all
	case errors.Is(err, errBlocked):
		return err
	case ctx.Err() != nil:
		return fmt.Errorf("request via %s: %w", l.Name(), ctx.Err())
	default:
		return fmt.Errorf("%w via %s: %w", errNetwork, l.Name(), err)
	}
}

func (c *playStoreClient) checkStatus(resp *http.Response) error {
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	serr := &statusError{Code: resp.StatusCode}
	switch code := resp.StatusCode; {
	case code == http.StatusNotFound:
		serr.kind = errNotFound
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		serr.kind = errRateLimited
		serr.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), c.cfg.Clock.Now())
	case code >= 500:
		serr.kind = errUpstream
		serr.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), c.cfg.Clock.Now())
	default:
		serr.kind = errUnexpectedStatus
	}
	return serr
}

// parseRetryAfter reads delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// leaseOutcomeOf says what an attempt's error tells about the egress used.
func leaseOutcomeOf(ctx context.Context, err error) leaseOutcome {
	switch {
	case err == nil || errors.Is(err, errNotFound):
		return outcomeOK
	case errors.Is(err, errRateLimited):
		return outcomeThrottled
	case ctx.Err() != nil || errors.Is(err, errRPCEntry):
		return outcomeNeutral
	case errors.Is(err, errNetwork) || errors.Is(err, errUpstream):
		return outcomeFailed
	default:
		return outcomeNeutral
	}
}

// stopAtBlockPage is the egresses' redirect policy: a redirect to Google's
// captcha ("/sorry/") or consent page ends the request as errBlocked instead
// of fetching a page that cannot be parsed.
func stopAtBlockPage(req *http.Request, via []*http.Request) error {
	if strings.HasPrefix(req.URL.Path, "/sorry/") || strings.HasPrefix(req.URL.Hostname(), "consent.") {
		return fmt.Errorf("%w (redirected to %s://%s%s)", errBlocked, req.URL.Scheme, req.URL.Host, req.URL.Path)
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}
