package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// Outcomes of a crawl path as app_crawl_outcomes keeps them (docs/schema.md):
// the status page and GET /api/v1/apps/{package_name} show them.
const (
	crawlOK         = "ok"
	crawlNotFound   = "not_found"   // HTTP 404: no listing in this storefront
	crawlThrottled  = "throttled"   // 429/503 (or a captcha) after the retries
	crawlBenched    = "benched"     // the wait for an egress ended with it benched
	crawlDNS        = "dns"         // DNS lookup failed
	crawlNetwork    = "network"     // other connection errors
	crawlTimeout    = "timeout"     // CRAWL_APP_TIMEOUT passed
	crawlParseError = "parse_error" // a 200 answer not understood
	crawlCanceled   = "canceled"    // shutdown, or the job's partition taken away
	crawlHTTPError  = "http_error"  // another HTTP status
	crawlError      = "error"       // anything else (a publish that failed, …)
)

// crawlStateWriteTimeout bounds a write of a read mark or an outcome, which
// runs also when the crawl's context has ended.
const crawlStateWriteTimeout = 5 * time.Second

// crawlOutcome is one path's last outcome.
type crawlOutcome struct {
	At         time.Time
	Outcome    string
	HTTPStatus *int   // the store's HTTP status, when it answered
	Error      string // one line, no secrets; "" for ok
}

// crawlOutcomeOf classifies a path's error; ctx is the job's context, whose
// end means the crawl was canceled whatever the error says. The store's
// answer wins over the deadline that ended the retries after it: "throttled"
// tells more than "timeout".
func crawlOutcomeOf(ctx context.Context, err error) crawlOutcome {
	o := crawlOutcome{At: time.Now().UTC(), Outcome: crawlOK}
	if err == nil {
		return o
	}
	o.Error = outcomeErrorText(err)
	var (
		serr  *statusError
		perr  *parseError
		derr  *net.DNSError
		bench []benchedEgress
	)
	if be := (*egressBenchedError)(nil); errors.As(err, &be) {
		bench = be.Benched
	} else if bw := (*benchWaitError)(nil); errors.As(err, &bw) {
		bench = bw.Benched
	}
	status := func(code int) *int { return &code }
	switch {
	case errors.Is(ctx.Err(), context.Canceled) || errors.Is(err, context.Canceled):
		o.Outcome = crawlCanceled
	case len(bench) > 0:
		// The bench that ends first: when the crawl could go on.
		first := bench[0]
		for _, b := range bench[1:] {
			if b.Until.Before(first.Until) {
				first = b
			}
		}
		o.Outcome = crawlBenched
		o.Error = fmt.Sprintf("egress %s benched until %s UTC", first.Name, first.Until.UTC().Format("15:04"))
	case errors.As(err, &serr):
		o.HTTPStatus = status(serr.Code)
		switch {
		case errors.Is(err, errNotFound):
			o.Outcome = crawlNotFound
		case errors.Is(err, errRateLimited):
			o.Outcome = crawlThrottled
		default:
			o.Outcome = crawlHTTPError
		}
	case errors.Is(err, errBlocked):
		o.Outcome = crawlThrottled
	case errors.As(err, &perr):
		// Only a 200 answer is parsed.
		o.Outcome, o.HTTPStatus = crawlParseError, status(200)
	case errors.Is(err, errRPCEntry):
		o.Outcome, o.HTTPStatus = crawlError, status(200)
	case errors.As(err, &derr):
		o.Outcome = crawlDNS
	case errors.Is(err, errNetwork):
		o.Outcome = crawlNetwork
	case errors.Is(err, context.DeadlineExceeded):
		o.Outcome = crawlTimeout
	default:
		o.Outcome = crawlError
	}
	return o
}

// maxOutcomeError bounds the kept error text.
const maxOutcomeError = 500

// outcomeErrorText is err on one line, at most maxOutcomeError bytes, with
// what stands as a password masked as everywhere else (maskPasswords: a
// proxy's user:password@, with or without a scheme, password=): it is
// stored, and shown on the status page and by the API.
func outcomeErrorText(err error) string {
	s := maskPasswords(strings.Join(strings.Fields(err.Error()), " "))
	if len(s) > maxOutcomeError {
		s = strings.ToValidUTF8(s[:maxOutcomeError], "") + "…"
	}
	return s
}

// RecordOutcome upserts pkg's outcome of path in the storefront loc. Of two
// crawls of one app at once (a job crawled again after a rebalance) the
// one that ended last stays.
func (p *pgKnownReviews) RecordOutcome(ctx context.Context, pkg string, loc locale, path string, o crawlOutcome) error {
	_, err := p.pool.Exec(ctx, `
INSERT INTO app_crawl_outcomes (application_id, country, lang, path, at, outcome, http_status, error)
SELECT id, $2, $3, $4, $5, $6, $7, $8 FROM apps_registry_application WHERE package_name = $1
ON CONFLICT (application_id, country, lang, path) DO UPDATE
SET at = EXCLUDED.at, outcome = EXCLUDED.outcome, http_status = EXCLUDED.http_status, error = EXCLUDED.error
WHERE app_crawl_outcomes.at <= EXCLUDED.at`, pkg, loc.Country, loc.Lang, path, o.At, o.Outcome, o.HTTPStatus, o.Error)
	if err != nil {
		return fmt.Errorf("crawl outcome of %s (%s): %w", pkg, path, err)
	}
	return nil
}

// CrawledSince says whether both paths of pkg in the storefront loc were
// crawled to an end that needs no new crawl (ok, or the listing not found)
// after since. The crawler records an outcome only once the path's messages
// are confirmed by the broker, so such a crawl lost nothing.
func (p *pgKnownReviews) CrawledSince(ctx context.Context, pkg string, loc locale, since time.Time) (bool, error) {
	var ended int
	err := p.pool.QueryRow(ctx, `
SELECT count(*) FROM app_crawl_outcomes o JOIN apps_registry_application a ON a.id = o.application_id
WHERE a.package_name = $1 AND o.country = $2 AND o.lang = $3 AND o.path IN ($4, $5) AND o.at > $6 AND o.outcome IN ($7, $8)`,
		pkg, loc.Country, loc.Lang, pathStats, pathReviews, since, crawlOK, crawlNotFound).Scan(&ended)
	if err != nil {
		return false, fmt.Errorf("crawl outcomes of %s: %w", pkg, err)
	}
	return ended == 2, nil
}

// pathOutcome is one path's last crawl as the API shows it.
type pathOutcome struct {
	At         time.Time `json:"at"`
	Outcome    string    `json:"outcome"`
	HTTPStatus *int      `json:"http_status"`
	Error      string    `json:"error"`
}

// lastCrawl is the last_crawl member of GET /api/v1/apps/{package_name}:
// nil per path never crawled in the storefront.
type lastCrawl struct {
	Stats   *pathOutcome `json:"stats"`
	Reviews *pathOutcome `json:"reviews"`
}

// LastCrawl reads the app's last outcome per path in the storefront loc.
func (s *appStore) LastCrawl(ctx context.Context, appID int64, loc locale) (lastCrawl, error) {
	rows, err := s.reads.Query(ctx, `
SELECT path, at, outcome, http_status, error FROM app_crawl_outcomes
WHERE application_id = $1 AND country = $2 AND lang = $3`, appID, loc.Country, loc.Lang)
	if err != nil {
		return lastCrawl{}, fmt.Errorf("last crawl of app %d: %w", appID, err)
	}
	defer rows.Close()
	var lc lastCrawl
	for rows.Next() {
		var path string
		o := &pathOutcome{}
		if err := rows.Scan(&path, &o.At, &o.Outcome, &o.HTTPStatus, &o.Error); err != nil {
			return lastCrawl{}, fmt.Errorf("last crawl of app %d: %w", appID, err)
		}
		o.At = o.At.UTC()
		switch path {
		case pathStats:
			lc.Stats = o
		case pathReviews:
			lc.Reviews = o
		}
	}
	if err := rows.Err(); err != nil {
		return lastCrawl{}, fmt.Errorf("last crawl of app %d: %w", appID, err)
	}
	return lc, nil
}
