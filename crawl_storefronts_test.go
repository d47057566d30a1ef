package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// setTestStorefronts gives the registered app pkg the storefronts locs, in
// order, as the registry stores them.
func setTestStorefronts(t *testing.T, pool *pgxpool.Pool, pkg string, locs ...locale) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `DELETE FROM app_storefronts WHERE application_id = (SELECT id FROM apps_registry_application WHERE package_name = $1)`, pkg); err != nil {
		t.Fatal(err)
	}
	for i, l := range locs {
		if _, err := pool.Exec(ctx, `INSERT INTO app_storefronts (application_id, position, country, lang)
			SELECT id, $2, $3, $4 FROM apps_registry_application WHERE package_name = $1`, pkg, i, l.Country, l.Lang); err != nil {
			t.Fatal(err)
		}
	}
}

// A cycle over N apps of two storefronts publishes 2N jobs on crawl-jobs,
// keyed by package and storefront (all keys distinct), spread over the
// partitions so that an app's storefronts go to different workers; each is
// crawled once in its storefront. A storefront where the app is not
// published (404) is not_found for that storefront alone, the app's other
// storefront is crawled as usual, and the per-app series carry country and
// lang. A storefront added to an app mid-cycle gets its first crawl from the
// new-app watch, and a job of an older playwatch, keyed by the package
// alone, is crawled like any other.
func TestSchedulerPlansAJobPerAppAndStorefront(t *testing.T) {
	t.Parallel()
	f := newCrawlFixture(t, testCrawlerConfig(3, 20), nil) // crawl-jobs has 3 partitions
	const apps = 10
	ir, us, de := locale{Lang: "fa", Country: "ir"}, locale{Lang: "en", Country: "us"}, locale{Lang: "de", Country: "de"}
	pkgs := make([]string, apps)
	for i := range pkgs {
		pkgs[i] = fmt.Sprintf("com.example.sf%02d", i)
		a := replayApp{Reviews: 20}
		if i == 0 {
			a.NotIn = []string{"ir"} // not published in Iran
		}
		f.replay.setApp(pkgs[i], a)
		f.register(t, pkgs[i], false)
		setTestStorefronts(t, f.pool, pkgs[i], ir, us)
	}

	m := startFleetMember(t, f, 6*time.Second)
	ctx := context.Background()
	waitFor(t, 30*time.Second, "cycle 1 to finish", func() bool {
		return count(t, f.pool, `SELECT count(*) FROM crawl_cycles WHERE id = 1 AND finished_at IS NOT NULL`) == 1
	})

	// The jobs: one per app and storefront, keys distinct, spread.
	jobs := consumeAll(t, f.brokers, topicCrawlJobs, 2*apps)
	keys := map[string]bool{}
	partsOf := map[string]map[int32]bool{}
	parts := map[int32]int{}
	for _, r := range jobs {
		jm, bad := decodeCrawlJob(r.Value, time.Now())
		if bad != nil {
			t.Fatalf("job %s: %s", r.Value, bad.detail)
		}
		key := crawlJobKey(jm.PackageName, locale{Lang: jm.Lang, Country: jm.Country})
		if string(r.Key) != key || keys[key] {
			t.Errorf("job %s keyed %q (want %q, seen before: %v)", r.Value, r.Key, key, keys[key])
		}
		keys[key] = true
		if partsOf[jm.PackageName] == nil {
			partsOf[jm.PackageName] = map[int32]bool{}
		}
		partsOf[jm.PackageName][r.Partition] = true
		parts[r.Partition]++
	}
	if len(keys) != 2*apps {
		t.Errorf("%d distinct job keys, want %d (%d apps × 2 storefronts)", len(keys), 2*apps, apps)
	}
	for _, pkg := range pkgs {
		for _, l := range []locale{ir, us} {
			if !keys[crawlJobKey(pkg, l)] {
				t.Errorf("no job for %s in %s/%s", pkg, l.Country, l.Lang)
			}
		}
	}
	split := 0
	for _, ps := range partsOf {
		if len(ps) > 1 {
			split++
		}
	}
	if len(parts) < 2 || split == 0 {
		t.Errorf("jobs per partition %v, %d of %d apps with their storefronts on different partitions: not spread", parts, split, apps)
	}
	t.Logf("jobs per partition %v; %d of %d apps have their two storefronts on different partitions", parts, split, apps)
	if got := count(t, f.pool, `SELECT apps FROM crawl_cycles WHERE id = 1`); got != apps {
		t.Errorf("crawl_cycles.apps = %d, want %d (apps, not jobs)", got, apps)
	}
	for name, want := range map[string]float64{"playwatch_crawl_jobs_published_total": 2 * apps, "playwatch_crawl_jobs_done_total": 2 * apps} {
		if got := m.metric(t, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}

	// Each app read once in each storefront; the one not published in Iran
	// answers 404 there, so its Iranian reviews are not asked for.
	for i, pkg := range pkgs {
		for _, l := range []string{"fa/ir", "en/us"} {
			wantReviews := 1
			if i == 0 && l == "fa/ir" {
				wantReviews = 0
			}
			if n := f.replay.requestsIn("details", pkg, l); n != 1 {
				t.Errorf("%s: listing requested %d times in %s, want once", pkg, n, l)
			}
			if n := f.replay.requestsIn("reviews", pkg, l); n != wantReviews {
				t.Errorf("%s: reviews requested %d times in %s, want %d", pkg, n, l, wantReviews)
			}
		}
	}
	if n := endOffsets(t, f.brokers, topicAppStats); n != 2*apps-1 {
		t.Errorf("%d app-stats records, want %d (every app and storefront but the 404)", n, 2*apps-1)
	}
	outcomes := map[string]string{}
	rows, err := f.pool.Query(ctx, `SELECT a.package_name || ' ' || o.country || '/' || o.lang || ' ' || o.path, o.outcome
		FROM app_crawl_outcomes o JOIN apps_registry_application a ON a.id = o.application_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k, o string
		if err := rows.Scan(&k, &o); err != nil {
			t.Fatal(err)
		}
		outcomes[k] = o
	}
	rows.Close()
	if len(outcomes) != 4*apps {
		t.Errorf("%d outcome rows, want %d (per app, storefront and path): %v", len(outcomes), 4*apps, outcomes)
	}
	for k, want := range map[string]string{
		pkgs[0] + " ir/fa stats": crawlNotFound, pkgs[0] + " ir/fa reviews": crawlNotFound,
		pkgs[0] + " us/en stats": crawlOK, pkgs[0] + " us/en reviews": crawlOK, pkgs[1] + " ir/fa reviews": crawlOK,
	} {
		if outcomes[k] != want {
			t.Errorf("outcome of %s: %q, want %q", k, outcomes[k], want)
		}
	}
	streak := func(pkg string, l locale, path string) float64 {
		return metricValue(t, m.reg, "playwatch_crawl_consecutive_failures", map[string]string{"package": pkg, "country": l.Country, "lang": l.Lang, "path": path})
	}
	if a, b := streak(pkgs[0], ir, pathStats), streak(pkgs[0], us, pathStats); a != 1 || b != 0 {
		t.Errorf("%s stats failure streak: %v in ir/fa, %v in us/en; want 1 and 0", pkgs[0], a, b)
	}
	if got := metricValue(t, m.reg, "playwatch_crawl_last_success_timestamp_seconds",
		map[string]string{"package": pkgs[1], "country": "ir", "lang": "fa", "path": pathReviews}); got < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("last success of %s reviews in ir/fa = %v", pkgs[1], got)
	}

	// A storefront added to an app after the cycle was planned gets its
	// first crawl from the new-app watch; its other storefronts wait for
	// the next cycle.
	setTestStorefronts(t, f.pool, pkgs[1], ir, us, de)
	waitFor(t, 10*time.Second, "the added storefront crawled", func() bool {
		return m.metric(t, "playwatch_crawl_jobs_done_total") == 2*apps+1
	})
	if n := f.replay.requestsIn("details", pkgs[1], "de/de"); n != 1 {
		t.Errorf("the added storefront's listing requested %d times, want once", n)
	}
	if n, m := f.replay.requestsIn("details", pkgs[1], "fa/ir"), f.replay.requestsIn("details", pkgs[1], "en/us"); n != 1 || m != 1 {
		t.Errorf("the app's other storefronts read again: %d and %d times, want once each", n, m)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM crawl_new_app_jobs j JOIN apps_registry_application a ON a.id = j.application_id
		WHERE j.cycle_id = 1 AND a.package_name = $1 AND j.country = 'de' AND j.lang = 'de'`, pkgs[1]); n != 1 {
		t.Errorf("%d crawl_new_app_jobs rows for the added storefront, want 1", n)
	}
	if got := m.metric(t, "playwatch_crawl_new_apps_total"); got != 1 {
		t.Errorf("playwatch_crawl_new_apps_total = %v, want 1", got)
	}

	// A job of an older playwatch: keyed by the package, no lease epoch.
	old, err := crawlJobMessage{CycleID: 1, PlannedAt: messageTime(time.Now()), PackageName: pkgs[2], Lang: "en", Country: "us"}.encode()
	if err != nil {
		t.Fatal(err)
	}
	produce(t, f.brokers, rec(topicCrawlJobs, pkgs[2], old))
	waitFor(t, 10*time.Second, "the older playwatch's job crawled", func() bool {
		return m.metric(t, "playwatch_crawl_jobs_done_total") == 2*apps+2
	})
	if n := f.replay.requestsIn("details", pkgs[2], "en/us"); n != 2 {
		t.Errorf("%s read %d times in en/us, want twice (the cycle, the older job)", pkgs[2], n)
	}
}

// The incremental stop compares a crawl's pages with the stored reviews of
// its own storefront (review_storefronts): a review stored from another
// storefront only is not known to it, and each storefront has its own read
// mark and count.
func TestKnownReviewsPerStorefront(t *testing.T) {
	t.Parallel()
	pool := newTestPool(t)
	ctx := context.Background()
	registerApps(t, pool, "com.example.known")
	us, ir, de := locale{Lang: "en", Country: "us"}, locale{Lang: "fa", Country: "ir"}, locale{Lang: "de", Country: "de"}
	at := time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)
	for i, sfs := range [][]locale{{us}, {us, ir}, {ir}, {us}} {
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO reviews (application_id, review_id, content, at, last_synced_at)
			SELECT id, $1, $2, $3, $3 FROM apps_registry_application WHERE package_name = 'com.example.known' RETURNING id`,
			fmt.Sprintf("r%d", i), fmt.Sprintf("text %d", i), at.Add(time.Duration(i)*time.Minute)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		for _, l := range sfs {
			if _, err := pool.Exec(ctx, `INSERT INTO review_storefronts (review_id, application_id, country, lang, first_seen_at)
				SELECT id, application_id, $2, $3, now() FROM reviews WHERE id = $1`, id, l.Country, l.Lang); err != nil {
				t.Fatal(err)
			}
		}
	}
	k := newPGKnownReviews(pool)
	if err := k.SetReadMark(ctx, "com.example.known", us, review{ReviewID: "r3", At: at.Add(3 * time.Minute)}, at.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		loc    locale
		ids    []string
		marked bool
	}{{us, []string{"r0", "r1", "r3"}, true}, {ir, []string{"r1", "r2"}, false}, {de, nil, false}} {
		got, err := k.KnownReviews(ctx, "com.example.known", c.loc, knownReviewsLimit, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.newest) != len(c.ids) || (len(c.ids) > 0 && got.stored != len(c.ids)) || got.mark.IsZero() == c.marked {
			t.Errorf("%s/%s: %d known (stored %d, mark %v), want %v, marked %v", c.loc.Country, c.loc.Lang, len(got.newest), got.stored, got.mark, c.ids, c.marked)
		}
		for _, id := range c.ids {
			if _, ok := got.newest[id]; !ok {
				t.Errorf("%s/%s: %s not known", c.loc.Country, c.loc.Lang, id)
			}
		}
	}
	// In us/en a page with r3 (stored from us/en, at the mark) ends the
	// paging; one with r2, stored from ir/fa only, does not.
	got, err := k.KnownReviews(ctx, "com.example.known", us, knownReviewsLimit, 100)
	if err != nil {
		t.Fatal(err)
	}
	text := func(s string) *string { return &s }
	if !got.reached([]review{{ReviewID: "r3", At: at.Add(3 * time.Minute), Content: text("text 3")}}) {
		t.Error("us/en: a page with its stored review at the mark does not end the paging")
	}
	if got.reached([]review{{ReviewID: "r2", At: at.Add(2 * time.Minute), Content: text("text 2")}}) {
		t.Error("us/en: a page with a review stored from ir/fa only ends the paging")
	}
}

// Each storefront of an app is paged on its own: an app in two storefronts
// is read in full in each at first, then incrementally in each (one page);
// a storefront added later is read in full although the app's reviews are
// stored from the others, since none is known to come from it. A review is
// stored once and records every storefront it was seen in.
func TestCrawlIncrementalPerStorefront(t *testing.T) {
	t.Parallel()
	const pkg = "com.example.storefronts"
	f := newIncrementalFixture(t, 1000)
	f.crawler.cycle.FullSyncInterval = 365 * 24 * time.Hour // no resync falls in these hours
	f.replay.setApp(pkg, replayApp{Reviews: 1000})
	f.register(t, pkg, false)
	us, ir, gb := locale{Lang: "en", Country: "us"}, locale{Lang: "fa", Country: "ir"}, locale{Lang: "en", Country: "gb"}
	setTestStorefronts(t, f.pool, pkg, us, ir)
	start := time.Date(2026, 8, 1, 0, 0, 0, 0, time.UTC)
	seen := map[string]int{}
	pages := func(loc string) int {
		n := f.replay.requestsIn("reviews", pkg, loc)
		d := n - seen[loc]
		seen[loc] = n
		return d
	}
	for h, c := range []struct {
		add       bool // gb/en added before the cycle
		fullReads int
		want      map[string]int // reviews requests per storefront
	}{
		{false, 2, map[string]int{"en/us": 7, "fa/ir": 7}},
		{false, 0, map[string]int{"en/us": 1, "fa/ir": 1}},
		{true, 1, map[string]int{"en/us": 1, "fa/ir": 1, "en/gb": 7}},
	} {
		if c.add {
			setTestStorefronts(t, f.pool, pkg, us, ir, gb)
		}
		sum := f.cycleAt(t, start.Add(time.Duration(h)*time.Hour))
		if sum.FullReads != c.fullReads || sum.Apps != len(c.want) {
			t.Errorf("cycle %d: %s; want %d crawls, %d full reads", h, sum, len(c.want), c.fullReads)
		}
		for loc, want := range c.want {
			if n := pages(loc); n != want {
				t.Errorf("cycle %d: %d reviews requests in %s, want %d", h, n, loc, want)
			}
		}
	}
	// A storefront taken off the app loses its per-app series at the next
	// cycle; the others keep theirs.
	seriesOf := func(l locale) float64 {
		return metricValue(t, f.reg, "playwatch_crawl_consecutive_failures", map[string]string{"package": pkg, "country": l.Country, "lang": l.Lang, "path": pathStats})
	}
	if got := seriesOf(ir); got != 0 {
		t.Errorf("ir/fa stats failure streak %v, want 0", got)
	}
	setTestStorefronts(t, f.pool, pkg, us, gb)
	f.cycleAt(t, start.Add(3*time.Hour))
	if n, err := testutil.GatherAndCount(f.reg, "playwatch_crawl_consecutive_failures", "playwatch_crawl_last_success_timestamp_seconds"); err != nil || n != 8 {
		t.Errorf("%d per-app series after taking ir/fa off (%v), want 8 (2 storefronts × 2 paths × 2 metrics)", n, err)
	}
	if n := count(t, f.pool, `SELECT count(*) FROM reviews`); n != 1000 {
		t.Errorf("%d reviews rows, want 1000 (each stored once)", n)
	}
	for _, l := range []locale{us, ir, gb} {
		if n := count(t, f.pool, `SELECT count(*) FROM review_storefronts WHERE country = $1 AND lang = $2`, l.Country, l.Lang); n != 1000 {
			t.Errorf("%d reviews recorded in %s/%s, want 1000", n, l.Country, l.Lang)
		}
		var mark *time.Time
		if err := f.pool.QueryRow(context.Background(), `SELECT max(newest_at) FROM review_read_marks WHERE country = $1 AND lang = $2`, l.Country, l.Lang).Scan(&mark); err != nil || mark == nil {
			t.Errorf("%s/%s has no read mark (%v)", l.Country, l.Lang, err)
		}
	}
}
