//go:build live

package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
)

// TestLivePlayStore is the canary for Google changing the page or the RPC:
// it reads two real apps and checks every contract field. Run it with
// `go test -tags live -run Live .`; it skips when the Play Store cannot be
// reached.
func TestLivePlayStore(t *testing.T) {
	probe, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(probe, http.MethodHead, defaultPlayStoreURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Skipf("the Play Store cannot be reached, live canary skipped: %v", err)
	}
	resp.Body.Close()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	reg := prometheus.NewRegistry()
	pool, err := newProxyPool(defaultProxyPoolConfig(), reg, log)
	if err != nil {
		t.Fatal(err)
	}
	client, err := newPlayStoreClient(defaultPlayStoreConfig(), pool, nil, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	locales := testLocales
	for _, app := range []struct {
		pkg     string
		iranian bool
	}{
		{"com.google.android.apps.translate", false},
		{"org.telegram.messenger", true},
	} {
		t.Run(app.pkg, func(t *testing.T) {
			loc := locales.forApp(app.iranian)
			d, err := client.Details(ctx, app.pkg, loc.Lang, loc.Country)
			if err != nil {
				t.Fatal(err)
			}
			checkLiveDetails(t, d, loc)
			reviews, err := client.Reviews(ctx, app.pkg, loc.Lang, loc.Country, 300, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkLiveReviews(t, app.pkg, loc, reviews, app.iranian)
		})
	}
}

func checkLiveDetails(t *testing.T, d appDetails, loc locale) {
	t.Helper()
	now := time.Now()
	m := appStatsFromDetails(d, loc)
	raw, _ := json.Marshal(m)
	t.Logf("app-stats: %s", raw)
	switch {
	case m.Title == nil || *m.Title == "":
		t.Error("no title")
	case m.Genre == nil || *m.Genre == "":
		t.Error("no genre")
	case m.MinInstalls == nil || *m.MinInstalls < 1_000_000:
		t.Errorf("min_installs %v", m.MinInstalls)
	case m.Score == nil || *m.Score < 1 || *m.Score > 5:
		t.Errorf("score %v", m.Score)
	case m.Ratings == nil || *m.Ratings < 1000:
		t.Errorf("ratings %v", m.Ratings)
	case m.ReviewsCount == nil || *m.ReviewsCount < 100 || *m.ReviewsCount > *m.Ratings:
		t.Errorf("reviews_count %v (ratings %v)", m.ReviewsCount, m.Ratings)
	case m.AdSupported == nil:
		t.Error("ad_supported null")
	case m.AppUpdatedAt == nil || m.AppUpdatedAt.Before(now.AddDate(-2, 0, 0)) || m.AppUpdatedAt.After(now.Add(time.Hour)):
		t.Errorf("app_updated_at %v", m.AppUpdatedAt)
	case m.CrawledAt.Before(now.Add(-5*time.Minute)) || m.CrawledAt.After(now.Add(time.Minute)):
		t.Errorf("crawled_at %v", m.CrawledAt)
	case d.Developer == nil || d.Currency == nil:
		t.Errorf("developer %v currency %v", d.Developer, d.Currency)
	}
	// Big apps often show "Varies with device": null is legitimate, an empty
	// string is not.
	if m.Version != nil && *m.Version == "" {
		t.Error("empty version")
	}
}

func checkLiveReviews(t *testing.T, pkg string, loc locale, reviews []review, wantPersian bool) {
	t.Helper()
	if len(reviews) < 150 {
		t.Fatalf("%d reviews, want at least one full page", len(reviews))
	}
	now := time.Now()
	persian := 0
	for i, r := range reviews {
		m := reviewMessageFrom(pkg, loc, r)
		switch {
		case m.ReviewID == "":
			t.Errorf("review %d: no id", i)
		case m.Score == nil || *m.Score < 1 || *m.Score > 5:
			t.Errorf("review %s: score %v", m.ReviewID, m.Score)
		case m.At.Before(now.AddDate(-5, 0, 0)) || m.At.After(now.Add(time.Hour)):
			t.Errorf("review %s: at %v", m.ReviewID, m.At)
		case i > 0 && r.At.After(reviews[i-1].At):
			t.Errorf("review %d is newer than the one before: not newest first", i)
		case m.ThumbsUpCount < 0 || m.UserName == nil:
			t.Errorf("review %s: thumbs %d user %v", m.ReviewID, m.ThumbsUpCount, m.UserName)
		}
		if m.Content != nil {
			for _, c := range *m.Content {
				if unicode.Is(unicode.Arabic, c) {
					persian++
					break
				}
			}
		}
	}
	if wantPersian && persian == 0 {
		t.Error("hl=fa served no review in Persian script")
	}
}
