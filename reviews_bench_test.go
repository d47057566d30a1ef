package main

import (
	"bufio"
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

//go:embed sentiment_lexicon.txt
var benchLexicon []byte

// benchWords is the size of the benchmark's vocabulary: with 10 words a
// review, a word is in about 1 review in 200.
const benchWords = 2000

// benchVocabulary is the words of the reviews the benchmark stores: the
// lexicon's Persian, Finglish and English words in their normal form, and
// made-up ones up to benchWords.
func benchVocabulary() []string {
	var words []string
	sc := bufio.NewScanner(bytes.NewReader(benchLexicon))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		entry, _, _ := strings.Cut(line, "\t")
		for _, w := range searchWords(entry) {
			if len([]rune(w)) >= 3 && !slices.Contains(words, w) {
				words = append(words, w)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	letters := []rune("abcdefghijklmnopqrstuvwxyzابپتثجچحخدذرزژسشصضطظعغفقکگلمنوهی")
	for len(words) < benchWords {
		b := make([]rune, 4+r.IntN(5))
		for i := range b {
			b[i] = letters[r.IntN(len(letters))]
		}
		words = append(words, string(b))
	}
	return words
}

// BenchmarkReviewsSearch searches 1M stored reviews (50 apps, 10 words
// each from benchVocabulary) for one word through GET /api/v1/reviews, the
// newest 50 matches, and reports the p50 and p95 over different words
// (goal: p95 under 100 ms). Loading the data and building the trigram
// index take a few minutes; `-benchtime 1x` checks that it runs.
func BenchmarkReviewsSearch(b *testing.B) {
	pool := newTestPool(b)
	ctx := b.Context()
	var apps []string
	for i := range 50 {
		apps = append(apps, fmt.Sprintf("com.example.bulk%d", i))
	}
	registerApps(b, pool, apps...)
	words := benchVocabulary()
	start := time.Now()
	// The index is built once after the load, as a backfill of an existing
	// table would leave it, rather than updated a million times.
	if _, err := pool.Exec(ctx, `DROP INDEX reviews_search_text_idx`); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO reviews (application_id, review_id, score, content, search_text, search_version, at, first_at, last_synced_at)
		SELECT a.ids[1 + g % 50], 'bench' || g, 1 + g % 5, t.text, ' ' || t.text || ' ', 1,
			$2::timestamptz - g * interval '7 seconds', $2::timestamptz - g * interval '7 seconds', $2::timestamptz
		FROM generate_series(1, 1000000) g
		CROSS JOIN (SELECT array_agg(id ORDER BY id) AS ids FROM apps_registry_application) a
		CROSS JOIN LATERAL (SELECT string_agg(($1::text[])[1 + floor(random() * array_length($1::text[], 1))::int], ' ') AS text
			FROM generate_series(1, 10) k WHERE g > 0) t`, words, testCrawl); err != nil {
		b.Fatal(err)
	}
	for _, sql := range []string{`CREATE INDEX reviews_search_text_idx ON reviews USING GIN (search_text gin_trgm_ops)`, `VACUUM ANALYZE reviews`} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("1M reviews of %d words stored and indexed in %s", len(words), time.Since(start).Round(time.Second))
	srv, _ := reviewsServer(b, pool, "")
	r := rand.New(rand.NewPCG(3, 4))
	b.ResetTimer()
	var took []time.Duration
	found := 0
	for b.Loop() {
		for range 40 {
			w := words[r.IntN(len(words))]
			t0 := time.Now()
			resp, err := http.Get(srv.URL + "/api/v1/reviews?q=" + url.QueryEscape(w))
			if err != nil {
				b.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took = append(took, time.Since(t0))
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("%s: %d %s", w, resp.StatusCode, body)
			}
			found += bytes.Count(body, []byte(`"review_id"`))
		}
	}
	slices.Sort(took)
	p := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000 }
	b.ReportMetric(p(0.5), "p50-ms")
	b.ReportMetric(p(0.95), "p95-ms")
	b.ReportMetric(float64(found)/float64(len(took)), "reviews/search")
}
