package main

import (
	"context"
	"testing"
)

func BenchmarkPlayParseDetails(b *testing.B) {
	page := readPlaystoreFixture(b, "details_com.mojang.minecraftpe_en_us.html")
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parseDetailsPage(page); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pages/s")
}

func BenchmarkPlayParseReviewsPage(b *testing.B) {
	body := readPlaystoreFixture(b, "reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if p, err := parseReviewsAnswer(body, "UsvDTd"); err != nil || len(p.Reviews) != 150 {
			b.Fatal(len(p.Reviews), err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "pages/s")
}

// BenchmarkPlayFetchReviews1000 reads 1000 reviews (7 pages) from the local
// replay server with the rate limit lifted: client, HTTP and parsing.
func BenchmarkPlayFetchReviews1000(b *testing.B) {
	rs := newReplayPlayStore(b)
	rs.setApp("com.example.app", replayApp{Reviews: 5000})
	ts := newTestPlayStore(b, rs.URL, func(p *proxyPoolConfig, c *playStoreConfig) {
		p.Clock, c.Clock = systemClock{}, systemClock{}
	})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		got, err := ts.client.Reviews(ctx, "com.example.app", "en", "us", 1000, nil)
		if err != nil || len(got) != 1000 {
			b.Fatal(len(got), err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "reviews/s")
}

// BenchmarkPlayFetchDetails reads one details page from the replay server.
func BenchmarkPlayFetchDetails(b *testing.B) {
	rs := newReplayPlayStore(b)
	ts := newTestPlayStore(b, rs.URL, func(p *proxyPoolConfig, c *playStoreConfig) {
		p.Clock, c.Clock = systemClock{}, systemClock{}
	})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ts.client.Details(ctx, "com.example.app", "en", "us"); err != nil {
			b.Fatal(err)
		}
	}
}
