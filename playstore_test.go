package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// replayDetails asks a client, tuned by tune, for pkg's details in en/us
// from a replay Play Store that serves app as pkg.
func replayDetails(t *testing.T, pkg string, app replayApp, tune func(*proxyPoolConfig, *playStoreConfig)) (*replayPlayStore, *testPlayStore, appDetails, error) {
	t.Helper()
	rs := newReplayPlayStore(t)
	rs.setApp(pkg, app)
	ts := newTestPlayStore(t, rs.URL, tune)
	d, err := ts.client.Details(context.Background(), pkg, "en", "us")
	return rs, ts, d, err
}

func TestPlayClientDetailsForAnyPackage(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("ir.example.bank", replayApp{Title: "بانک نمونه"})
	ts := newTestPlayStore(t, rs.URL, nil)
	before := time.Now()
	d, err := ts.client.Details(context.Background(), "ir.example.bank", "fa", "ir")
	if err != nil {
		t.Fatal(err)
	}
	if d.PackageName != "ir.example.bank" || d.Title != "بانک نمونه" || *d.MinInstalls != 50000000 || *d.Version != "1.26.32.2" {
		t.Fatalf("details %+v", d)
	}
	if d.FetchedAt.Before(before.Add(-time.Second)) || d.FetchedAt.Location() != time.UTC {
		t.Errorf("fetched at %v", d.FetchedAt)
	}
	if rs.requests("details", "ir.example.bank") != 1 || requestsMetric(t, ts, "ok") != 1 {
		t.Errorf("requests %d, ok metric %v", rs.requests("details", "ir.example.bank"), requestsMetric(t, ts, "ok"))
	}
	if n := metricValue(t, ts.reg, "playwatch_playstore_request_duration_seconds", map[string]string{"endpoint": "details"}); n != 1 {
		t.Errorf("latency observations %v", n)
	}
}

func TestPlayClientReviewsPagingStopsAtN(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("com.example.many", replayApp{Reviews: 2000})
	rs.setApp("com.example.few", replayApp{Reviews: 320})
	ts := newTestPlayStore(t, rs.URL, nil)
	ctx := context.Background()

	for _, tc := range []struct {
		pkg         string
		n, want     int
		wantFetches int
	}{
		{"com.example.many", 0, 1000, 7}, // default n: 7 pages of 150, cut to 1000
		{"com.example.many", 200, 200, 2},
		{"com.example.few", 1000, 320, 3}, // the token ends first: 150+150+20
	} {
		before := rs.requests("reviews", tc.pkg)
		got, err := ts.client.Reviews(ctx, tc.pkg, "en", "us", tc.n, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != tc.want {
			t.Fatalf("%s n=%d: %d reviews, want %d", tc.pkg, tc.n, len(got), tc.want)
		}
		if fetches := rs.requests("reviews", tc.pkg) - before; fetches != tc.wantFetches {
			t.Errorf("%s n=%d: %d requests, want %d", tc.pkg, tc.n, fetches, tc.wantFetches)
		}
		for i, r := range got {
			if r.ReviewID != replayReviewID(tc.pkg, i) || !r.At.Equal(replayReviewAt(i)) {
				t.Fatalf("review %d: %s at %v, want %s at %v", i, r.ReviewID, r.At, replayReviewID(tc.pkg, i), replayReviewAt(i))
			}
		}
	}
	if q, size := rs.lastReviewsRequest(); size != 150 || q.Get("hl") != "en" || q.Get("gl") != "us" {
		t.Errorf("page size %d, query %v", size, q)
	}
}

func TestPlayClientReviewsFollowRecordedToken(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.useFixtureReviews("com.google.android.apps.translate")
	ts := newTestPlayStore(t, rs.URL, nil)
	got, err := ts.client.Reviews(context.Background(), "com.google.android.apps.translate", "en", "us", 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Page 1, page 2 (reached with page 1's recorded token), then the empty
	// answer to page 2's token.
	if len(got) != 300 || rs.requests("reviews", "com.google.android.apps.translate") != 3 {
		t.Fatalf("%d reviews in %d requests", len(got), rs.requests("reviews", "com.google.android.apps.translate"))
	}
	if got[0].ReviewID != "017452fc-0d4b-471d-b406-bcf0f52387a7" || got[150].ReviewID != "631c8899-005f-47b7-9480-0b480748eebf" {
		t.Errorf("first of each page: %s, %s", got[0].ReviewID, got[150].ReviewID)
	}
	if got[0].At.Unix() != 1783346124 || got[0].At.Nanosecond() != 77000000 {
		t.Errorf("first at %v", got[0].At)
	}
}

func TestPlayClientReviewsDeduplicate(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.useFixtureReviews("com.google.android.apps.translate")
	p1 := readPlaystoreFixture(t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	// The continuation answers page 1 again: nothing new, so paging stops,
	// with an error: the pages past it were never read, so the read was
	// not complete (no read mark may follow it).
	rs.setFixturePage(fixtureToken(t, p1), p1)
	ts := newTestPlayStore(t, rs.URL, nil)
	got, err := ts.client.Reviews(context.Background(), "com.google.android.apps.translate", "en", "us", 1000, nil)
	if !errors.Is(err, errIncompletePaging) {
		t.Fatalf("err %v, want incomplete paging", err)
	}
	ids := make(map[string]bool)
	for _, r := range got {
		if ids[r.ReviewID] {
			t.Fatalf("duplicate %s", r.ReviewID)
		}
		ids[r.ReviewID] = true
	}
	if len(got) != 150 || rs.requests("reviews", "com.google.android.apps.translate") != 2 {
		t.Fatalf("%d reviews in %d requests, want 150 in 2", len(got), rs.requests("reviews", "com.google.android.apps.translate"))
	}
}

func TestPlayClient429ThenSuccessBacksOff(t *testing.T) {
	rs, ts, d, err := replayDetails(t, "com.example.busy", replayApp{DetailsFaults: []replayFault{fault429, fault503}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Title != "App com.example.busy" || rs.requests("details", "com.example.busy") != 3 {
		t.Fatalf("title %q after %d requests", d.Title, rs.requests("details", "com.example.busy"))
	}
	// min(2s·2^n, 30s)·(0.5+0.5): 2 s, then 4 s.
	if waits := ts.clock.allWaits(); !slices.Equal(waits, []time.Duration{2 * time.Second, 4 * time.Second}) {
		t.Errorf("backoff waits %v, want [2s 4s]", waits)
	}
	if requestsMetric(t, ts, "rate_limited") != 2 || requestsMetric(t, ts, "ok") != 1 {
		t.Errorf("metrics rate_limited %v ok %v", requestsMetric(t, ts, "rate_limited"), requestsMetric(t, ts, "ok"))
	}
	// Two throttled answers in a row bench the (only) egress: the third
	// attempt waited for its cool-down, then probed it.
	if waits := ts.poolClock.allWaits(); !slices.Equal(waits, []time.Duration{time.Minute}) {
		t.Errorf("pool waits %v, want the 1m cool-down", waits)
	}
	if h := metricValue(t, ts.reg, "playwatch_proxy_healthy", nil); h != 1 {
		t.Errorf("healthy egresses %v after the probe succeeded", h)
	}
}

func TestPlayClientBackoffJitterAndCap(t *testing.T) {
	_, ts, _, err := replayDetails(t, "com.example.down", replayApp{DetailsAlways: fault500}, func(_ *proxyPoolConfig, c *playStoreConfig) {
		c.Random = fixedRandom(0.99)
		c.BackoffCap = 5 * time.Second
	})
	if !errors.Is(err, errUpstream) || !strings.Contains(err.Error(), "gave up after 4 attempts") {
		t.Fatalf("error %v", err)
	}
	want := []time.Duration{2980 * time.Millisecond, 5960 * time.Millisecond, 7450 * time.Millisecond} // 2s, 4s, min(8s, 5s) times 1.49
	if waits := ts.clock.allWaits(); !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
}

func TestPlayClientRespectsRetryAfter(t *testing.T) {
	_, ts, _, err := replayDetails(t, "com.example.slowdown", replayApp{DetailsFaults: []replayFault{fault429}, RetryAfter: "7"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if waits := ts.clock.allWaits(); !slices.Equal(waits, []time.Duration{7 * time.Second}) {
		t.Errorf("waits %v, want the 7s of Retry-After", waits)
	}
}

func TestPlayClientStopsBeforeTheDeadline(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("com.example.busy", replayApp{DetailsAlways: fault429})
	ts := newTestPlayStore(t, rs.URL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := ts.client.Details(ctx, "com.example.busy", "en", "us")
	// Waits of 2 s then 4 s: the second would end after the 5 s deadline.
	if !errors.Is(err, errRateLimited) || !strings.Contains(err.Error(), "would pass the deadline") {
		t.Fatalf("error %v", err)
	}
	if n := rs.requests("details", "com.example.busy"); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}

func TestPlayClient404IsPermanent(t *testing.T) {
	rs, ts, _, err := replayDetails(t, "com.example.gone", replayApp{DetailsAlways: fault404}, nil)
	if !errors.Is(err, errNotFound) || errorReason(err) != "not_found" || isTransient(err) {
		t.Fatalf("error %v (reason %s)", err, errorReason(err))
	}
	if n := rs.requests("details", "com.example.gone"); n != 1 {
		t.Errorf("%d requests for a 404, want exactly 1", n)
	}
	if len(ts.clock.allWaits()) != 0 || requestsMetric(t, ts, "not_found") != 1 {
		t.Errorf("waits %v, not_found metric %v", ts.clock.allWaits(), requestsMetric(t, ts, "not_found"))
	}
}

func TestPlayClientBlockPagesAreRateLimits(t *testing.T) {
	for name, fault := range map[string]replayFault{"captcha": faultCaptcha, "consent": faultConsent} {
		t.Run(name, func(t *testing.T) {
			rs, _, _, err := replayDetails(t, "com.example.app", replayApp{DetailsAlways: fault}, nil)
			if !errors.Is(err, errBlocked) || !errors.Is(err, errRateLimited) || errorReason(err) != "rate_limited" {
				t.Fatalf("error %v", err)
			}
			if n := rs.requests("details", "com.example.app"); n != 4 {
				t.Errorf("%d requests, want 4 (retried as transient)", n)
			}
			if rs.captchaFetches() != 0 {
				t.Error("the client followed the redirect to the captcha page")
			}
		})
	}
}

func TestPlayClientCutBodyIsRetried(t *testing.T) {
	rs, ts, d, err := replayDetails(t, "com.example.flaky", replayApp{DetailsFaults: []replayFault{faultCutBody}}, nil)
	if err != nil || d.Title != "App com.example.flaky" {
		t.Fatalf("%q, %v", d.Title, err)
	}
	if n := rs.requests("details", "com.example.flaky"); n != 2 || requestsMetric(t, ts, "error") != 1 {
		t.Errorf("%d requests, error metric %v", n, requestsMetric(t, ts, "error"))
	}
}

func TestPlayClientTimeoutIsRetried(t *testing.T) {
	rs, _, d, err := replayDetails(t, "com.example.slow", replayApp{DetailsFaults: []replayFault{faultSlow}},
		func(p *proxyPoolConfig, _ *playStoreConfig) { p.HeaderTimeout = 100 * time.Millisecond })
	if err != nil || d.Title != "App com.example.slow" {
		t.Fatalf("%q, %v", d.Title, err)
	}
	if n := rs.requests("details", "com.example.slow"); n != 2 {
		t.Errorf("%d requests", n)
	}
}

func TestPlayClientUnreadablePagesAreParseErrors(t *testing.T) {
	for name, fault := range map[string]replayFault{"truncated": faultTruncated, "no data block": faultNoDataBlock} {
		t.Run(name, func(t *testing.T) {
			rs, ts, _, err := replayDetails(t, "com.example.odd", replayApp{DetailsAlways: fault}, nil)
			var perr *parseError
			if !errors.As(err, &perr) || perr.Path != "ds:5[1][2][0][0]" || errorReason(err) != "parse_error" {
				t.Fatalf("error %v", err)
			}
			if n := rs.requests("details", "com.example.odd"); n != 1 || requestsMetric(t, ts, "parse_error") != 1 {
				t.Errorf("%d requests (parse errors are not retried), metric %v", n, requestsMetric(t, ts, "parse_error"))
			}
		})
	}
}

func TestPlayClientErrorEntryIsRetried(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("com.example.app", replayApp{Reviews: 100, ReviewsFaults: []replayFault{faultRPCError}})
	ts := newTestPlayStore(t, rs.URL, nil)
	got, err := ts.client.Reviews(context.Background(), "com.example.app", "en", "us", 1000, nil)
	if err != nil || len(got) != 100 {
		t.Fatalf("%d reviews, %v", len(got), err)
	}
	if n := rs.requests("reviews", "com.example.app"); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}

	// An error entry that persists ends the paging with the reviews so far.
	rs.setApp("com.example.app", replayApp{Reviews: 1000, ReviewsFaults: []replayFault{faultNone}, ReviewsAlways: faultRPCError})
	got, err = ts.client.Reviews(context.Background(), "com.example.app", "en", "us", 1000, nil)
	if !errors.Is(err, errUpstream) || len(got) != 150 || !strings.Contains(err.Error(), "page 2") {
		t.Fatalf("%d reviews, %v", len(got), err)
	}
}

func TestPlayClientUnratedApp(t *testing.T) {
	page := editDetailsBlock(t, readPlaystoreFixture(t, "details_com.mojang.minecraftpe_en_us.html"), func(r []any) { r[51] = nil })
	_, _, d, err := replayDetails(t, "com.mojang.minecraftpe", replayApp{DetailsPage: page}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Score != nil || d.Ratings != nil || d.ReviewsCount != nil || d.ScoreText != nil {
		t.Fatalf("unrated app has score %v ratings %v reviews %v", d.Score, d.Ratings, d.ReviewsCount)
	}
	if *d.MinInstalls != 50000000 || *d.Version != "1.26.32.2" {
		t.Fatalf("other fields lost: %+v", d)
	}
	m := appStatsFromDetails(d, testLocales.Default)
	if m.Score != nil || m.Ratings != nil || m.ReviewsCount != nil {
		t.Fatalf("message %+v", m)
	}
}

func TestPlayClientPersianReviews(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("ir.example.chat", replayApp{Reviews: 20, Persian: true})
	ts := newTestPlayStore(t, rs.URL, nil)
	loc := testLocales.forApp(true)
	got, err := ts.client.Reviews(context.Background(), "ir.example.chat", loc.Lang, loc.Country, 1000, nil)
	if err != nil || len(got) != 20 {
		t.Fatalf("%d reviews, %v", len(got), err)
	}
	if q, _ := rs.lastReviewsRequest(); q.Get("hl") != "fa" || q.Get("gl") != "ir" {
		t.Errorf("query %v", q)
	}
	want := "نظر 3: برنامه خیلی خوبیه 👍🏽🇮🇷\nممنون\u0000"
	if *got[3].Content != want || *got[3].UserName != "کاربر 3" {
		t.Fatalf("content %q by %q", *got[3].Content, *got[3].UserName)
	}
	m := reviewMessageFrom("ir.example.chat", loc, got[3])
	if *m.Content != strings.TrimSuffix(want, "\u0000") {
		t.Errorf("message content %q: U+0000 not stripped or newline lost", *m.Content)
	}
}

// testLocales are the locale defaults of config.go.
var testLocales = localeDefaults{Default: locale{"en", "us"}, Iranian: locale{"fa", "ir"}}

// Iranian apps are read in Persian for Iran, the others in English for the
// US, unless the configuration says otherwise.
func TestPlayLocaleDefaults(t *testing.T) {
	c, err := loadTestConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Locales.forApp(false) != (locale{"en", "us"}) || c.Locales.forApp(true) != (locale{"fa", "ir"}) || c.Locales != testLocales {
		t.Fatalf("%v %v", c.Locales.forApp(false), c.Locales.forApp(true))
	}
	c, err = loadTestConfig(map[string]string{"PLAYSTORE_LANG": "de", "PLAYSTORE_COUNTRY": "de"})
	if err != nil || c.Locales.forApp(false) != (locale{"de", "de"}) || c.Locales.forApp(true) != (locale{"fa", "ir"}) {
		t.Fatal(c.Locales, err)
	}
}

func TestPlayErrorReasons(t *testing.T) {
	for err, want := range map[error]string{
		nil:         "ok",
		errNotFound: "not_found",
		&statusError{Code: 429, kind: errRateLimited}: "rate_limited",
		errBlocked:             "rate_limited",
		&parseError{Path: "x"}: "parse_error",
		errNetwork:             "error",
		errUpstream:            "error",
		context.Canceled:       "error",
	} {
		if got := errorReason(err); got != want {
			t.Errorf("errorReason(%v) = %s, want %s", err, got, want)
		}
	}
}

// The replay server as the crawler tests will use it: many apps at once,
// one missing, one whose reviews fail, one whose details fail.
func TestPlayReplayServesManyApps(t *testing.T) {
	rs := newReplayPlayStore(t)
	rs.setApp("com.example.app03", replayApp{DetailsAlways: fault404})
	rs.setApp("com.example.app07", replayApp{ReviewsAlways: fault500})
	rs.setApp("com.example.app11", replayApp{DetailsAlways: faultNoDataBlock})
	ts := newTestPlayStore(t, rs.URL, func(p *proxyPoolConfig, _ *playStoreConfig) { p.MaxInFlight = 4 })
	type result struct {
		pkg                    string
		detailsErr, reviewsErr error
		reviews                int
	}
	results := make(chan result, 20)
	for i := range 20 {
		go func() {
			pkg := fmt.Sprintf("com.example.app%02d", i)
			r := result{pkg: pkg}
			var d appDetails
			d, r.detailsErr = ts.client.Details(context.Background(), pkg, "en", "us")
			if r.detailsErr == nil && d.Title != "App "+pkg {
				r.detailsErr = fmt.Errorf("title %q", d.Title)
			}
			var rv []review
			rv, r.reviewsErr = ts.client.Reviews(context.Background(), pkg, "en", "us", 200, nil)
			r.reviews = len(rv)
			results <- r
		}()
	}
	for range 20 {
		r := <-results
		switch r.pkg {
		case "com.example.app03":
			if !errors.Is(r.detailsErr, errNotFound) || rs.requests("details", r.pkg) != 1 {
				t.Errorf("%s: %v after %d requests", r.pkg, r.detailsErr, rs.requests("details", r.pkg))
			}
		case "com.example.app07":
			if r.detailsErr != nil || !errors.Is(r.reviewsErr, errUpstream) || rs.requests("reviews", r.pkg) != 4 {
				t.Errorf("%s: %v, %v after %d requests", r.pkg, r.detailsErr, r.reviewsErr, rs.requests("reviews", r.pkg))
			}
		case "com.example.app11":
			if errorReason(r.detailsErr) != "parse_error" || r.reviewsErr != nil || r.reviews != 200 {
				t.Errorf("%s: %v, %v, %d reviews", r.pkg, r.detailsErr, r.reviewsErr, r.reviews)
			}
		default:
			if r.detailsErr != nil || r.reviewsErr != nil || r.reviews != 200 {
				t.Errorf("%s: %v, %v, %d reviews", r.pkg, r.detailsErr, r.reviewsErr, r.reviews)
			}
		}
	}
	// 20 details, 2 review pages each but 4 attempts at the failing one's
	// first; no page 2 was refused for a stranger's NID.
	if n := rs.totalRequests(); n != 20+19*2+4 || rs.nidsIssued() != 1 {
		t.Errorf("%d requests in all, %d NIDs issued", n, rs.nidsIssued())
	}
}
