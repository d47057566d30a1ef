package main

import (
	"context"
	"testing"
	"time"
)

// The read mark only moves forward, except from a mark dated more than
// readMarkMargin after the read's crawl time, which a bad future at left
// and which would otherwise stay ahead of every later review; a review
// dated past the margin is refused as a mark.
func TestSetReadMarkForwardOnlyAndCapped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTestPool(t)
	const pkg = "com.example.marks"
	registerApps(t, pool, pkg)
	known := newPGKnownReviews(pool)
	loc := testLocales.Default
	read := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	mark := func() (at time.Time, id string) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT newest_at, newest_review_id FROM review_read_marks`).Scan(&at, &id); err != nil {
			t.Fatal(err)
		}
		return at, id
	}
	set := func(id string, at, readAt time.Time) error {
		return known.SetReadMark(ctx, pkg, loc, review{ReviewID: id, At: at}, readAt)
	}
	for _, step := range []struct {
		name      string
		id        string
		at, read  time.Time
		wantErr   bool
		wantID    string
		wantAtSet time.Time
	}{
		{"first mark", "r1", read.Add(-time.Minute), read, false, "r1", read.Add(-time.Minute)},
		{"an older read's newest review moves nothing", "r0", read.Add(-time.Hour), read.Add(time.Hour), false, "r1", read.Add(-time.Minute)},
		{"a newer one moves it", "r2", read.Add(30 * time.Minute), read.Add(time.Hour), false, "r2", read.Add(30 * time.Minute)},
		{"one dated past the margin is refused", "future", read.Add(3*time.Hour + time.Second), read.Add(2 * time.Hour), true, "r2", read.Add(30 * time.Minute)},
		{"the margin itself is allowed", "edge", read.Add(3 * time.Hour), read.Add(2 * time.Hour), false, "edge", read.Add(3 * time.Hour)},
	} {
		err := set(step.id, step.at, step.read)
		if (err != nil) != step.wantErr {
			t.Fatalf("%s: err %v", step.name, err)
		}
		if at, id := mark(); id != step.wantID || !at.Equal(step.wantAtSet) {
			t.Fatalf("%s: mark %s at %s, want %s at %s", step.name, id, at, step.wantID, step.wantAtSet)
		}
	}

	// A mark pinned in the future (written before the cap) is replaced by
	// the next complete read, although that one's newest review is older.
	if _, err := pool.Exec(ctx, `UPDATE review_read_marks SET newest_at = $1, newest_review_id = 'pinned'`, read.AddDate(1, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if err := set("r3", read.Add(5*time.Hour), read.Add(5*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if at, id := mark(); id != "r3" || !at.Equal(read.Add(5*time.Hour)) {
		t.Fatalf("pinned mark not replaced: %s at %s", id, at)
	}
}

// A complete read whose newest reviews are dated after the crawl time and
// its margin sets the mark at the newest review within it.
func TestCrawlReadMarkLeavesOutFutureReviews(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.future"
	f := newCrawlFixture(t, testCrawlerConfig(1, 300), nil)
	f.replay.setApp(pkg, replayApp{Reviews: 300})
	f.register(t, pkg, false)
	// Reviews 0-99 are dated more than readMarkMargin after the crawl time.
	j := crawlJob{App: app{PackageName: pkg, IsActive: true}, CrawledAt: replayReviewAt(100).Add(-readMarkMargin), Locale: testLocales.Default}
	if r := f.crawler.crawlApp(context.Background(), j); r.reviewsErr != nil || r.reviews != 300 {
		t.Fatalf("crawl: %+v", r)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM review_read_marks WHERE newest_review_id = $1 AND newest_at = $2 AND read_at = $3`,
		replayReviewID(pkg, 100), replayReviewAt(100), j.CrawledAt); n != 1 {
		t.Error("the read mark is not review 100, the newest within the margin")
	}

	// A read whose every review is past the margin sets no mark.
	if _, err := f.pool.Exec(context.Background(), `DELETE FROM review_read_marks`); err != nil {
		t.Fatal(err)
	}
	j.CrawledAt = replayReviewAt(299).Add(-readMarkMargin - time.Second)
	if r := f.crawler.crawlApp(context.Background(), j); r.reviewsErr != nil {
		t.Fatalf("crawl: %+v", r)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM review_read_marks`); n != 0 {
		t.Errorf("%d read marks after a read of future reviews only, want 0", n)
	}
}
