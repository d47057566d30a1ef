package main

import "testing"

// BenchmarkSentimentClassify: reviews per second of Classify on the
// recorded Play Store reviews and our Persian dev sentences, in turn (the
// goal is at least 20,000/s on one core: go test -bench Sentiment -cpu 1).
func BenchmarkSentimentClassify(b *testing.B) {
	m := testSentimentModel(b)
	var items []sentItem
	items = append(items, playstoreSentimentItems(b)...)
	items = append(items, readSentimentTSV(b, "dev_fa.tsv")...)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		it := items[i%len(items)]
		m.Classify(it.Text, it.Stars)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reviews/s")
}
