package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const playstoreTestdata = "testdata/playstore"

func readPlaystoreFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(playstoreTestdata, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// expectedValues is testdata/playstore/expected_values.json: per fixture, the
// values a correct parser extracts.
func expectedValues(t testing.TB) map[string]map[string]any {
	t.Helper()
	return readJSONFile[map[string]map[string]any](t, filepath.Join(playstoreTestdata, "expected_values.json"))
}

// detailsView names the parsed fields as expected_values.json does.
func detailsView(d appDetails) map[string]any {
	var updated *int64
	if d.UpdatedAt != nil {
		u := d.UpdatedAt.Unix()
		updated = &u
	}
	var adsRaw []string
	if d.AdsLabel != nil {
		adsRaw = []string{*d.AdsLabel}
	}
	return map[string]any{
		"details_block":       d.Block,
		"slots":               d.Slots,
		"sparse_keys":         append([]string{}, d.SparseKeys...),
		"title":               d.Title,
		"genre":               d.Genre,
		"genreId":             d.GenreID,
		"installsText":        d.InstallsText,
		"minInstalls":         d.MinInstalls,
		"realInstalls":        d.RealInstalls,
		"score":               d.Score,
		"scoreText":           d.ScoreText,
		"ratings":             d.Ratings,
		"reviews":             d.ReviewsCount,
		"version":             d.Version,
		"adSupported":         d.AdSupported,
		"adSupportedRaw":      adsRaw,
		"updated":             updated,
		"updatedText":         d.UpdatedText,
		"developer":           d.Developer,
		"developerId":         d.DeveloperID,
		"developerInternalId": d.DeveloperInternalID,
		"priceMicros":         d.PriceMicros,
		"currency":            d.Currency,
		"priceText":           d.PriceText,
		"free":                d.Free,
		"offersIAP":           d.OffersIAP,
		"available_code":      d.AvailableCode,
		"released":            d.Released,
		"contentRating":       d.ContentRating,
		"histogram":           d.Histogram,
		"releasedAt":          timeTuple(d.ReleasedAt),
		"recentChanges":       d.RecentChangesHTML,
	}
}

func timeTuple(t *time.Time) any {
	if t == nil {
		return nil
	}
	return []int64{t.Unix(), int64(t.Nanosecond())}
}

// reviewView names a review's fields as expected_values.json does.
func reviewView(r review) map[string]any {
	return map[string]any{
		"reviewId":             r.ReviewID,
		"userName":             r.UserName,
		"userImage":            r.UserImage,
		"score":                r.Score,
		"content":              r.Content,
		"at":                   timeTuple(&r.At),
		"thumbsUpCount":        r.ThumbsUpCount,
		"replyContent":         r.ReplyContent,
		"repliedAt":            timeTuple(r.RepliedAt),
		"reviewCreatedVersion": r.AppVersion,
	}
}

func compareExpectedFields(t *testing.T, got map[string]any, want map[string]any) {
	t.Helper()
	// Round-tripped, the parser's output and the expectations compare as
	// the same types (float64 numbers, nil for null).
	g := jsonRoundTrip[map[string]any](t, got)
	for k, w := range want {
		gv, ok := g[k]
		if !ok {
			t.Errorf("%s: not produced by the parser", k)
			continue
		}
		if !reflect.DeepEqual(gv, w) {
			t.Errorf("%s = %#v, want %#v", k, gv, w)
		}
	}
	for k := range g {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: produced but not in expected_values.json", k)
		}
	}
}

func TestPlayParseDetailsFixtures(t *testing.T) {
	exp := expectedValues(t)
	seen := 0
	for name, want := range exp {
		if !strings.HasPrefix(name, "details_") {
			continue
		}
		seen++
		t.Run(name, func(t *testing.T) {
			d, err := parseDetailsPage(readPlaystoreFixture(t, name))
			if err != nil {
				t.Fatal(err)
			}
			compareExpectedFields(t, detailsView(d), want)
		})
	}
	if seen != 5 {
		t.Fatalf("%d details fixtures in expected_values.json, want 5", seen)
	}
}

func TestPlayParseReviewsFixtures(t *testing.T) {
	exp := expectedValues(t)
	for _, page := range []string{"page1", "page2"} {
		name := "reviews_UsvDTd_com.google.android.apps.translate_en_us_" + page + ".txt"
		t.Run(page, func(t *testing.T) {
			want := exp[name]
			p, err := parseReviewsAnswer(readPlaystoreFixture(t, name), "UsvDTd")
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Reviews) != 150 || p.Skipped != 0 {
				t.Fatalf("%d reviews, %d skipped; want 150, 0", len(p.Reviews), p.Skipped)
			}
			if float64(len(p.Reviews)) != want["count"] {
				t.Errorf("count %d, want %v", len(p.Reviews), want["count"])
			}
			if !strings.HasPrefix(p.NextToken, want["nextToken_prefix"].(string)) || float64(len(p.NextToken)) != want["nextToken_len"] {
				t.Errorf("token %q (len %d), want prefix %v len %v", p.NextToken, len(p.NextToken), want["nextToken_prefix"], want["nextToken_len"])
			}
			t.Run("first", func(t *testing.T) { compareExpectedFields(t, reviewView(p.Reviews[0]), want["first"].(map[string]any)) })
			t.Run("last", func(t *testing.T) {
				compareExpectedFields(t, reviewView(p.Reviews[149]), want["last"].(map[string]any))
			})
			withReply, nullVersion := 0, 0
			var firstWithReply *review
			for i, r := range p.Reviews {
				if r.ReplyContent != nil {
					withReply++
					if firstWithReply == nil {
						firstWithReply = &p.Reviews[i]
					}
				}
				if r.AppVersion == nil {
					nullVersion++
				}
				if i > 0 && r.At.After(p.Reviews[i-1].At) {
					t.Errorf("review %d is newer than the one before: not newest-first", i)
				}
			}
			if float64(withReply) != want["with_reply"] || float64(nullVersion) != want["with_null_version"] {
				t.Errorf("with_reply %d, with_null_version %d; want %v, %v", withReply, nullVersion, want["with_reply"], want["with_null_version"])
			}
			if firstWithReply == nil {
				t.Fatal("no review with a reply")
			}
			compareExpectedFields(t, reviewView(*firstWithReply), want["first_with_reply"].(map[string]any))
		})
	}
}

// The 2026 details pages embed an oCPfdb reviews payload
// (docs/playstore-protocol.md §3.6):
// the same record parser must read it.
func TestPlayParseEmbeddedReviews(t *testing.T) {
	for name, want := range map[string]int{
		"details_com.mojang.minecraftpe_en_us.html":            20,
		"details_com.google.android.apps.translate_en_us.html": 20,
		"details_com.adex77.WhereAmI_en_us.html":               20,
		"details_com.raiseright.edumarketapp_en.html":          1,
		"details_com.youngkiu.stock_knee_shoulder_ko.html":     0,
	} {
		page := readPlaystoreFixture(t, name)
		keys := routedBlocks(page, "oCPfdb")
		if len(keys) != 1 {
			t.Fatalf("%s: oCPfdb routed to %v", name, keys)
		}
		var got *reviewsPage
		for key, data := range dataBlocks(page) {
			if key == keys[0] {
				p, err := parseReviewsPayload(jsonValue(data), key)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got = &p
			}
		}
		if got == nil || len(got.Reviews) != want || got.Skipped != 0 {
			t.Errorf("%s: embedded reviews %+v, want %d", name, got, want)
			continue
		}
		for _, r := range got.Reviews {
			if r.Score == nil || r.At.Year() < 2008 || r.UserName == nil {
				t.Errorf("%s: implausible review %+v", name, r)
			}
		}
	}
}

func TestPlayDetailsBlockIsFoundByRPCNotByNumber(t *testing.T) {
	page := readPlaystoreFixture(t, "details_com.mojang.minecraftpe_en_us.html")
	// Renumber: the app moves to ds:17 (and the routing table says so); a
	// parser that hard-codes ds:5 finds nothing there.
	moved := bytes.ReplaceAll(page, []byte("'ds:5'"), []byte("'ds:17'"))
	d, err := parseDetailsPage(moved)
	if err != nil {
		t.Fatal(err)
	}
	if d.Block != "ds:17" || d.Title != "Minecraft: Dream it, Build it!" {
		t.Fatalf("block %s title %q", d.Block, d.Title)
	}
	// Without the routing table the parser falls back to ds:5.
	noTable := bytes.ReplaceAll(page, []byte("AF_dataServiceRequests"), []byte("AF_somethingElse"))
	if d, err := parseDetailsPage(noTable); err != nil || d.Block != "ds:5" {
		t.Fatalf("without routing table: block %q, %v", d.Block, err)
	}
}

func TestPlayParseDetailsErrorsNameThePath(t *testing.T) {
	page := readPlaystoreFixture(t, "details_com.mojang.minecraftpe_en_us.html")
	cut := page[:bytes.Index(page, []byte("'ds:5', hash"))+2000]
	for name, body := range map[string][]byte{
		"empty":            nil,
		"html only":        []byte("<html><body>Hello</body></html>"),
		"cut in the block": cut,
		"no title":         bytes.Replace(page, []byte(`[["Minecraft: Dream it, Build it!"`), []byte(`[[null`), 1),
	} {
		_, err := parseDetailsPage(body)
		var perr *parseError
		if !errors.As(err, &perr) || !strings.Contains(perr.Path, "[1][2][0][0]") {
			t.Errorf("%s: error %v, want a parse error naming [1][2][0][0]", name, err)
		}
		if errorReason(err) != "parse_error" {
			t.Errorf("%s: reason %q", name, errorReason(err))
		}
	}
}

// The reviews payload is checked in the pass that reads it: a payload that is
// not exactly one JSON value is a parse error naming the element where
// reading stopped, never a short page.
func TestPlayParseReviewsRejectMalformedPayload(t *testing.T) {
	body := readPlaystoreFixture(t, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	var buf []byte
	payload, err := parseBatchexecute(body, "UsvDTd", &buf)
	if err != nil {
		t.Fatal(err)
	}
	text := string(payload)
	var records []string
	for _, r := range payload.index(0).elements() {
		records = append(records, string(r))
	}
	// Review 3 loses the comma after its id: its brackets still pair up.
	noComma := strings.Replace(text, records[3], strings.Replace(records[3], `",[`, `" [`, 1), 1)
	cut := text[:strings.Index(text, records[40])+len(records[40])/2]
	for name, c := range map[string]struct{ payload, path string }{
		"review without a comma":      {noComma, `["wrb.fr","UsvDTd"][2][0][3]`},
		"cut in review 40":            {cut, `["wrb.fr","UsvDTd"][2][0][40]`},
		"bad element after the token": {`[[],[null,"t"],nul]`, `["wrb.fr","UsvDTd"][2][2]`},
		"text after the value":        {text + ` []`, `["wrb.fr","UsvDTd"][2]`},
		"empty":                       {"", `["wrb.fr","UsvDTd"][2]`},
	} {
		page, err := parseReviewsAnswer(replayFrames("UsvDTd", c.payload), "UsvDTd")
		var perr *parseError
		if !errors.As(err, &perr) || perr.Path != c.path || !strings.Contains(perr.Detail, "not one JSON value") {
			t.Errorf("%s: error %v, want a parse error at %s", name, err, c.path)
		}
		if len(page.Reviews) != 0 || errorReason(err) != "parse_error" {
			t.Errorf("%s: %d reviews, reason %q", name, len(page.Reviews), errorReason(err))
		}
	}
}

// poisonParser is today's parser, except that it panics on a page that
// holds poison: a parser bug one app's page sets off.
type poisonParser struct{ poison []byte }

func (p poisonParser) details(b []byte) (appDetails, error) {
	if bytes.Contains(b, p.poison) {
		var none []int
		_ = none[len(b)] // index out of range
	}
	return storeParser{}.details(b)
}

func (p poisonParser) reviews(b []byte) (reviewsPage, error) {
	if bytes.Contains(b, p.poison) {
		panic("parser bug")
	}
	return storeParser{}.reviews(b)
}

// A page the parser panics on is a parse error of that app (counted as
// "parser panicked", naming the panic's site); the crawl of the other apps
// goes on.
func TestParserPanicIsAParseErrorOfThatApp(t *testing.T) {
	const bad, good = "com.example.poison", "com.example.fine"
	rs := newReplayPlayStore(t)
	rs.setApp(bad, replayApp{Reviews: 20})
	rs.setApp(good, replayApp{Reviews: 20})
	ts := newTestPlayStore(t, rs.URL, func(_ *proxyPoolConfig, c *playStoreConfig) { c.Parser = poisonParser{[]byte(bad)} })
	ctx := context.Background()
	var perr *parseError
	_, err := ts.client.Details(ctx, bad, "en", "us")
	if !errors.As(err, &perr) || perr.reason() != "parser panicked" || !strings.Contains(err.Error(), bad) ||
		!strings.Contains(err.Error(), "playstore_parse_test.go") || !strings.Contains(err.Error(), "index out of range") {
		t.Errorf("details of the poisoned app: %v; want a parse error naming the app and the panic", err)
	}
	if _, err := ts.client.Reviews(ctx, bad, "en", "us", 100, nil); !errors.As(err, &perr) || perr.reason() != "parser panicked" || !strings.Contains(err.Error(), "parser bug") {
		t.Errorf("reviews of the poisoned app: %v; want a parse error", err)
	}
	if d, err := ts.client.Details(ctx, good, "en", "us"); err != nil || d.Title != "App "+good {
		t.Errorf("details of the other app: %+v, %v", d, err)
	}
	if rv, err := ts.client.Reviews(ctx, good, "en", "us", 100, nil); err != nil || len(rv) != 20 {
		t.Errorf("reviews of the other app: %d, %v", len(rv), err)
	}
	for _, path := range []string{pathStats, pathReviews} {
		if got := metricValue(t, ts.reg, "playwatch_parse_failures_total", map[string]string{"path": path, "reason": "parser panicked"}); got != 1 {
			t.Errorf("%s parse failures (parser panicked): %v, want 1", path, got)
		}
	}
}
