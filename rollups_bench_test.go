package main

import (
	"context"
	"slices"
	"testing"
)

// BenchmarkReviewIngestRollups measures what keeping the rollups costs the
// storage consumer: BenchmarkReviewIngest's consumer over the same records
// with the rollup triggers of migration 17 disabled and enabled, runs
// interleaved PLAYWATCH_BENCH_ROUNDS times (default 3), medians reported as
// rows/s and their ratio. PLAYWATCH_BENCH_REVIEWS sets the dataset (default
// 60000; one in five a newer version with other stars, which moves counts).
func BenchmarkReviewIngestRollups(b *testing.B) {
	n := benchEnvInt(b, "PLAYWATCH_BENCH_REVIEWS", 60000, 1000)
	rounds := benchEnvInt(b, "PLAYWATCH_BENCH_ROUNDS", 3, 1)
	env := newIngestBenchEnv(b, n, benchConfig(b))
	triggers := [][2]string{{"reviews", "reviews_rollup_insert"}, {"reviews", "reviews_rollup_update"},
		{"review_storefronts", "review_storefronts_rollup_insert"}, {"app_stats", "app_stats_rollup_insert"}}
	setTriggers := func(on bool) {
		verb := "DISABLE"
		if on {
			verb = "ENABLE"
		}
		for _, t := range triggers {
			if _, err := env.pool.Exec(context.Background(), "ALTER TABLE "+t[0]+" "+verb+" TRIGGER "+t[1]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Cleanup(func() { setTriggers(true) })
	rates := map[string][]float64{}
	for range b.N {
		for range rounds {
			for _, v := range []struct {
				name string
				on   bool
			}{{"without-rollups", false}, {"with-rollups", true}} {
				// env.reset's list and CHECKPOINT, which the bench's role may not run.
				b.StopTimer()
				if _, err := env.pool.Exec(context.Background(), `TRUNCATE reviews, review_storefronts, app_stats, consumer_offsets, dead_letter_events,
					review_rollup_hourly, review_topic_rollup_hourly, review_rollup_totals, app_stats_rollup_daily`); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				setTriggers(v.on)
				rates[v.name] = append(rates[v.name], env.consumerIngest(b, n, 1))
			}
		}
	}
	for _, name := range []string{"without-rollups", "with-rollups"} {
		rs := rates[name]
		b.ReportMetric(median(rs), name+"-rows/s")
		b.Logf("%-16s median %6.0f rows/s, min %6.0f, max %6.0f", name, median(rs), slices.Min(rs), slices.Max(rs))
	}
	b.ReportMetric(median(rates["with-rollups"])/median(rates["without-rollups"]), "with/without")
}
