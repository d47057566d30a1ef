package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestSearchTextOf(t *testing.T) {
	for in, want := range map[string]string{
		"كيفيت خيلي بد":         " کیفیت خیلی بد ",
		"می‌شه":                 " میشه ",
		"نمی شه":                " نمیشه ",
		"Login FAILS, again!!!": " login fails again ",
		"۱۰۰ ٪ ٢٣":              " 100 23 ",
		"👍🏽 great":              " 👍 great ",
	} {
		got := searchTextOf(&in)
		if got == nil || *got != want {
			t.Errorf("%q: %v, want %q", in, got, want)
		}
	}
	for _, in := range []*string{nil, ptr(""), ptr(" ... ")} {
		if got := searchTextOf(in); got != nil {
			t.Errorf("%v: %q, want NULL", in, *got)
		}
	}
	if p := searchPatterns("ok 50%_x کیفیت"); strings.Join(p, "|") != `% ok %|% 50 %|% x %|%کیفیت%` {
		t.Errorf("patterns %q", p)
	}
}

// searchTextOf's output on a fixed text. When it changes, so must
// searchTextVersion: the backfill then writes every stored review again.
func TestSearchTextVersion(t *testing.T) {
	const text = "كيفيت خيلي بد شده، لاگين نمي‌شه! Login FAILS since v12.3 ۱۰۰٪ 👍🏽 عاااالی goooood ـــ ًٌ"
	got := *searchTextOf(ptr(text))
	sum := sha256.Sum256([]byte(got))
	const want = "2843cd016b89aa37"
	if d := hex.EncodeToString(sum[:8]); d != want || searchTextVersion != 1 {
		t.Errorf("searchTextOf gives %q (digest %s), version %d: the normalisation changed; raise searchTextVersion and set the digest here", got, d, searchTextVersion)
	}
}

// Reviews stored before migration 15 (no search text) or with an older
// normalisation are written by the backfill, which logs its progress.
func TestSearchBackfill(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `UPDATE reviews SET search_text = NULL, search_version = NULL, first_at = NULL WHERE review_id LIKE 'fa%'`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE reviews SET search_text = 'stale', search_version = 0 WHERE review_id = 'en1'`); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	n, err := backfillSearchText(ctx, pool, logger)
	if err != nil || n != 4 {
		t.Fatalf("backfilled %d, %v; want 4", n, err)
	}
	rows, _ := pool.Query(ctx, `SELECT review_id, search_text, search_version, first_at = at FROM reviews WHERE review_id IN ('fa1', 'en1') ORDER BY 1`)
	type st struct {
		ID      string
		Text    string
		Version int16
		FirstAt bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[st])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Text != " login fails since the update " || got[1].Text != " کیفیت خیلی بد شده لاگین نمیشه " ||
		got[0].Version != searchTextVersion || got[1].Version != searchTextVersion || !got[1].FirstAt {
		t.Errorf("after the backfill: %+v", got)
	}
	var finished struct {
		Msg     string
		Reviews int
	}
	for _, line := range bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
		_ = json.Unmarshal(line, &finished)
	}
	if finished.Msg != "search backfill finished" || finished.Reviews != 4 || !strings.Contains(logs.String(), `"msg":"search backfill starting","reviews":4`) {
		t.Errorf("log: %s", logs.String())
	}
	if n, err := backfillSearchText(ctx, pool, logger); n != 0 || err != nil {
		t.Errorf("second backfill: %d, %v", n, err)
	}
}

// The search and the paging use their indexes (the status page's plan
// test style): the trigram index for q, (application_id, first_at, id) for
// an app's newest reviews, (first_at, id) across apps.
func TestReviewsQueryPlans(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	seedReviewsAPI(t, pool)
	ctx := context.Background()
	for i := range 9 {
		registerApps(t, pool, fmt.Sprintf("com.example.app%d", i))
	}
	// 20,000 reviews over 11 apps, texts of varied trigrams.
	if _, err := pool.Exec(ctx, `INSERT INTO reviews (application_id, review_id, score, content, search_text, search_version, at, first_at, last_synced_at, topics)
		SELECT a.ids[1 + g % array_length(a.ids, 1)], 'gen' || g, 1 + g % 5, md5(g::text), ' ' || md5(g::text) || ' ', 1,
			now() - g * interval '1 minute', now() - g * interval '1 minute', now(),
			CASE WHEN g % 500 = 0 THEN ARRAY['battery'] ELSE ARRAY['ui'] END
		FROM generate_series(1, 20000) g, (SELECT array_agg(id) AS ids FROM apps_registry_application) a;
		ANALYZE reviews;
		INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
		SELECT id, application_id, CASE WHEN id % 50 = 0 THEN 'de' ELSE 'us' END, CASE WHEN id % 50 = 0 THEN 'de' ELSE 'en' END, first_seen_at FROM reviews
		ON CONFLICT DO NOTHING;
		ANALYZE review_storefronts`); err != nil {
		t.Fatal(err)
	}
	var divar int64
	if err := pool.QueryRow(ctx, `SELECT id FROM apps_registry_application WHERE package_name = 'ir.divar'`).Scan(&divar); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		q     reviewQuery
		apps  []int64
		index string
	}{
		"search":           {reviewQuery{reviewFilter: reviewFilter{Patterns: searchPatterns("962ac590"), Sort: "newest"}, Limit: 50}, nil, "reviews_search_text_idx"},
		"search in an app": {reviewQuery{reviewFilter: reviewFilter{Patterns: searchPatterns("کیفیت"), Sort: "newest"}, Limit: 50}, []int64{divar}, "reviews_search_text_idx reviews_application_id_at_idx"}, // a small app's reviews are read and filtered
		"an app, newest":   {reviewQuery{reviewFilter: reviewFilter{Sort: "newest"}, Limit: 50, Cursor: &reviewCursor{MaxID: 1 << 40, Key: 1 << 60, ID: 1 << 40}}, []int64{divar}, "reviews_application_id_first_at_idx"},
		"all, oldest":      {reviewQuery{reviewFilter: reviewFilter{Sort: "oldest"}, Limit: 50}, nil, "reviews_first_at_idx"},
		"a rare storefront": {reviewQuery{reviewFilter: reviewFilter{Countries: []string{"de"}, Sort: "newest"}, Limit: 50}, nil,
			"reviews_pkey reviews_first_at_idx review_storefronts_pkey review_storefronts_application_id_idx"},
		"an app's storefront": {reviewQuery{reviewFilter: reviewFilter{Countries: []string{"us"}, Langs: []string{"en"}, Sort: "newest"}, Limit: 50}, []int64{divar},
			"reviews_application_id_first_at_idx review_storefronts_pkey review_storefronts_application_id_idx"},
		"a rare topic": {reviewQuery{reviewFilter: reviewFilter{Topics: []string{"battery"}, Sort: "newest"}, Limit: 50}, nil, "reviews_topics_idx"},
	} {
		sql, args := reviewsSQL(c.q, c.apps, 1<<40)
		var plan []byte
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+sql, args...).Scan(&plan)
		})
		if err != nil {
			t.Fatalf("EXPLAIN %s: %v", name, err)
		}
		var doc []struct{ Plan planNode }
		if err := json.Unmarshal(plan, &doc); err != nil {
			t.Fatal(err)
		}
		used := false
		doc[0].Plan.walk(func(n planNode) {
			if n.Index != "" && slices.Contains(strings.Fields(c.index), n.Index) {
				used = true
			}
			if n.Relation == "reviews" && !strings.Contains(n.Type, "Index") && n.Type != "Bitmap Heap Scan" {
				t.Errorf("%s: reads reviews by %s", name, n.Type)
			}
		})
		if !used {
			t.Errorf("%s: does not use %s:\n%s", name, c.index, plan)
		}
	}
}
