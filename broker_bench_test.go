package main

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkBrokerBytesPerReview publishes, per iteration, the recorded
// Google Translate reviews as one app's (each given an id of its own)
// through the production producer into the embedded broker, and reports how
// much its files grew per review: the figure behind what the README says
// PLAYWATCH_BROKER_MAX_BYTES buys. Each batch holds every recorded review
// once: repeated texts would compress better than a real cycle's.
func BenchmarkBrokerBytesPerReview(b *testing.B) {
	var recorded []review
	for _, page := range []string{"reviews_UsvDTd_com.google.android.apps.translate_en_us_page1.txt", "reviews_UsvDTd_com.google.android.apps.translate_en_us_page2.txt"} {
		p, err := parseReviewsAnswer(readPlaystoreFixture(b, page), "UsvDTd")
		if err != nil {
			b.Fatal(err)
		}
		recorded = append(recorded, p.Reviews...)
	}
	perCycle := len(recorded)
	dir := b.TempDir()
	_, brokers := newTestBroker(b, dir)
	pub := newTestPublisher(b, brokers, testProducerSettings)
	before := dirBytes(b, dir)
	crawled := time.Date(2026, 7, 7, 10, 0, 0, 0, time.UTC)
	b.ResetTimer()
	for i := range b.N {
		pkg := fmt.Sprintf("com.example.app%d", i)
		ms := make([]reviewMessage, perCycle)
		for j := range ms {
			r := recorded[j%len(recorded)]
			r.ReviewID = fmt.Sprintf("%s-%d-%d", r.ReviewID, i, j)
			r.FetchedAt = crawled
			ms[j] = reviewMessageFrom(pkg, testLocales.Default, r)
		}
		if err := pub.PublishReviews(context.Background(), pkg, ms); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(dirBytes(b, dir)-before)/float64(b.N*perCycle), "bytes/review")
}
