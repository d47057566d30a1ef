package main

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkSentimentJob measures how fast the sentiment job scores a backlog
// of stored reviews (PLAYWATCH_BENCH_SENTIMENT_REVIEWS, default 200000;
// Persian and English texts of 60 to 200 characters, stars or none) in a
// managed PostgreSQL with its durable defaults (fsync, synchronous_commit),
// in batches of SENTIMENT_BATCH, against, in the same run:
//   - job-2conn: two jobs at once on two connections, as two instances
//     would share the work (FOR UPDATE SKIP LOCKED);
//   - one-statement: a single UPDATE of the same rows and columns, labelled by
//     the stars in SQL: the database's floor for rewriting them, with no
//     classification, no locking and no round trips;
//   - classify: the job's classifying alone (model and topics) over the
//     same texts, in Go, on every core.
//
// The variants run interleaved PLAYWATCH_BENCH_ROUNDS times (default 1) and
// the medians are reported: <variant>-rows/s, job-seconds (the goal: under
// 30 s for 200000) and job-%-of-one-statement. Run it with -benchtime 1x.
func BenchmarkSentimentJob(b *testing.B) {
	n := benchEnvInt(b, "PLAYWATCH_BENCH_SENTIMENT_REVIEWS", 200000, 1000)
	rounds := benchEnvInt(b, "PLAYWATCH_BENCH_ROUNDS", 1, 1)
	cfg := benchConfig(b)
	ctx := context.Background()
	pool := newDurableBenchPool(b)
	insertSentimentBenchReviews(b, pool, n)
	model, err := loadSentimentModel()
	if err != nil {
		b.Fatal(err)
	}
	reset := func() {
		mustExec(b, pool, `UPDATE reviews SET sentiment = NULL, sentiment_model = NULL, sentiment_at = NULL, sentiment_text_hash = NULL`)
		mustExec(b, pool, `VACUUM ANALYZE reviews`)
	}
	expectScored := func() {
		if scored := count(b, pool, `SELECT count(*) FROM reviews WHERE NOT `+sentimentTodo); scored != n {
			b.Fatalf("%d of %d reviews scored", scored, n)
		}
	}
	var texts []string
	var stars []int
	var text string
	var star int
	eachRow(b, pool, []any{&text, &star}, func() { texts, stars = append(texts, text), append(stars, star) },
		`SELECT coalesce(content, ''), coalesce(score, 0)::int FROM reviews`)

	variants := []struct {
		name string
		run  func(b *testing.B) time.Duration
	}{
		{"job", func(b *testing.B) time.Duration {
			j := newSentimentJob(pool, model, sentimentJobConfigOf(cfg), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
			start := time.Now()
			for {
				k, err := j.scoreBatch(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if k == 0 {
					break
				}
			}
			took := time.Since(start)
			expectScored()
			return took
		}},
		{"job-2conn", func(b *testing.B) time.Duration {
			start := time.Now()
			var wg sync.WaitGroup
			for range 2 {
				j := newSentimentJob(pool, model, sentimentJobConfigOf(cfg), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
				wg.Go(func() {
					for {
						k, err := j.scoreBatch(ctx)
						if err != nil {
							b.Error(err)
							return
						}
						if k == 0 {
							return
						}
					}
				})
			}
			wg.Wait()
			took := time.Since(start)
			expectScored()
			return took
		}},
		{"one-statement", func(b *testing.B) time.Duration {
			start := time.Now()
			if _, err := pool.Exec(ctx, `UPDATE reviews SET sentiment = CASE WHEN score >= 4 THEN 'POSITIVE' WHEN score <= 2 THEN 'NEGATIVE' ELSE 'NEUTRAL' END,
				sentiment_model = $1, sentiment_at = statement_timestamp(), sentiment_text_hash = reviews_sentiment_input(score, content)
				WHERE `+sentimentTodo, model.Version()); err != nil {
				b.Fatal(err)
			}
			took := time.Since(start)
			expectScored()
			return took
		}},
		{"classify", func(b *testing.B) time.Duration {
			batch := make([]scoredRow, len(texts))
			for i := range texts {
				batch[i] = scoredRow{text: texts[i], stars: stars[i]}
			}
			j := newSentimentJob(pool, model, sentimentJobConfigOf(cfg), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
			start := time.Now()
			j.classify(batch)
			return time.Since(start)
		}},
	}
	b.Logf("%d reviews, %d rounds; batches of %d, model %s", n, rounds, cfg.SentimentBatch, model.Version())
	b.ResetTimer()
	rates := map[string][]float64{}
	var jobSeconds []float64
	for range b.N {
		for range rounds {
			for _, v := range variants {
				b.StopTimer()
				reset()
				b.StartTimer()
				took := v.run(b)
				rates[v.name] = append(rates[v.name], float64(n)/took.Seconds())
				if v.name == "job" {
					jobSeconds = append(jobSeconds, took.Seconds())
				}
			}
		}
	}
	for _, v := range variants {
		rs := rates[v.name]
		b.ReportMetric(median(rs), v.name+"-rows/s")
		b.Logf("%-13s median %7.0f rows/s, min %7.0f, max %7.0f", v.name, median(rs), slices.Min(rs), slices.Max(rs))
	}
	b.ReportMetric(median(jobSeconds), "job-seconds")
	b.ReportMetric(100*median(rates["job"])/median(rates["one-statement"]), "job-%-of-one-statement")
}

// insertSentimentBenchReviews stores n unscored reviews of 40 apps.
func insertSentimentBenchReviews(b *testing.B, pool *pgxpool.Pool, n int) {
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO apps_registry_application (package_name) SELECT 'com.bench.app' || i FROM generate_series(1, 40) AS i`); err != nil {
		b.Fatal(err)
	}
	texts := []string{
		"Works well on my phone, but the last update made notifications late. Please fix it, otherwise five stars.",
		"برنامه خیلی خوبیه ولی از وقتی آپدیت شده مدام کرش میکنه و بدون فیلترشکن وصل نمیشه، لطفا درستش کنید",
		"Terrible. Ads after every screen and the subscription was charged twice. Uninstalled.",
		"عالیه 😍 سرعتش خیلی بهتر شده، ممنون از تیم پشتیبانی",
		"ok",
		"Stickers and channels are great, calls sometimes drop on mobile data. Good app overall, keep it up!",
	}
	if _, err := pool.Exec(ctx, `INSERT INTO reviews (application_id, review_id, score, content, at, last_synced_at)
		SELECT 1 + i % 40, 'bench-' || i, CASE WHEN i % 11 = 0 THEN NULL ELSE 1 + i % 5 END,
			CASE WHEN i % 13 = 0 THEN NULL ELSE ($1::text[])[1 + i % cardinality($1::text[])] || ' #' || i END,
			now() - make_interval(secs => i), now()
		FROM generate_series(1, $2::int) AS i`, texts, n); err != nil {
		b.Fatal(err)
	}
}
