package main

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fleetInstance is one `playwatch run --roles crawler,consumer` of the
// fleet test, with its own forward proxies (its egress labels in the replay
// log) and its own application_name on the shared database.
type fleetInstance struct {
	name string
	role string // its database role
	env  map[string]string
	log  string
	a    *appliance
}

func (f *fleetInstance) leads(t *testing.T) bool {
	return f.a.running() && f.a.metric(t, "playwatch_scheduler_leader", "") == 1
}

// fleetCycle is a crawl_cycles row.
type fleetCycle struct {
	id                int64
	planned, finished time.Time
	epoch             int64
	apps              int
	statsRows         int // app_stats rows at the cycle's planned time
	storefronts       int // distinct (app, storefront) among them
}

func fleetCycles(t *testing.T, pool *pgxpool.Pool) []fleetCycle {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c.id, c.planned_at, coalesce(c.finished_at, 'epoch'), c.leader_epoch, coalesce(c.apps, 0),
		(SELECT count(*) FROM app_stats s WHERE s.crawled_at = c.planned_at),
		(SELECT count(DISTINCT (s.application_id, s.country, s.lang)) FROM app_stats s WHERE s.crawled_at = c.planned_at)
		FROM crawl_cycles c ORDER BY c.id`)
	if err != nil {
		t.Fatal(err)
	}
	var out []fleetCycle
	var c fleetCycle
	if _, err := pgx.ForEachRow(rows, []any{&c.id, &c.planned, &c.finished, &c.epoch, &c.apps, &c.statsRows, &c.storefronts}, func() error {
		out = append(out, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// Three instances with the crawler role on one Apache Kafka and one
// PostgreSQL, each with two proxies of its own: one cycle over 30 apps of
// two storefronts each (60 jobs) crawls each app once in each storefront,
// spread over all three; the leader SIGKILLed mid-cycle is replaced within
// SCHEDULER_LEASE and the cycle completes with one app_stats row per app and
// storefront; a non-leader killed mid-cycle leaves its jobs to the others in
// the same cycle; a leader whose database connections are cut loses the
// lease, and no cycle is planned by two leaders.
func TestFaultFleetThreeInstances(t *testing.T) {
	requireFaultSuite(t)
	const (
		apps, reviewsPerApp = 30, 40
		jobs                = 2 * apps // each app in two storefronts
		lease               = 8 * time.Second
		interval            = 30 * time.Second
	)
	began := time.Now()
	k := apacheKafkaCluster(t, 1)
	clearPlaywatchTopics(t, k.Admin())
	bin := buildPlaywatch(t)
	replay := newReplayPlayStore(t)
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	run := fmt.Sprint(time.Now().UnixNano())

	fleet := make([]*fleetInstance, 3)
	for i := range fleet {
		name := fmt.Sprintf("inst%d", i)
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		// A login role of its own (a member of the writer role), so that
		// the test can cut this instance alone from the database.
		role := fmt.Sprintf("pwfleet_%s_%s", name, run[len(run)-8:])
		if err := testPG.exec(context.Background(), fmt.Sprintf("CREATE ROLE %s LOGIN IN ROLE %s", role, pgWriterRole)); err != nil {
			skipOrFailUnderCI(t, "the fleet test needs a superuser on the test cluster to create roles: %v", err)
		}
		t.Cleanup(func() { _ = testPG.exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
		u.User = url.User(role)
		var proxies []string
		for j := range 2 {
			proxies = append(proxies, newForwardProxy(t, fmt.Sprintf("%s-p%d", name, j)).URL)
		}
		fleet[i] = &fleetInstance{name: name, role: role, log: filepath.Join(t.TempDir(), name+".log"), env: map[string]string{
			"DATABASE_URL":        u.String(),
			"KAFKA_BROKERS":       strings.Join(k.Brokers(), ","),
			"PLAYWATCH_DATA_DIR":  t.TempDir(),
			"PLAYWATCH_HTTP_ADDR": freeAddr(t),
			"PLAYSTORE_URL":       replay.URL,
			"PROXIES":             strings.Join(proxies, ","),
			"RATE_LIMIT_REQUESTS": "0",
			// Two requests per job, two egresses per instance: a cycle
			// of 60 jobs takes about 10 s on three instances.
			"EGRESS_MIN_GAP":      "500ms",
			"REVIEWS_PER_APP":     strconv.Itoa(reviewsPerApp),
			"CRAWL_WORKERS":       "3",
			"CRAWL_INTERVAL":      interval.String(),
			"CRAWL_NEW_APP_CHECK": "1h",
			"SCHEDULER_LEASE":     lease.String(),
			"CONSUMER_GROUP":      "fleet-storage-" + run,
			"CRAWL_JOBS_GROUP":    "fleet-crawl-" + run,
		}}
	}
	defer func() {
		if t.Failed() {
			for _, f := range fleet {
				t.Logf("%s log:\n%s", f.name, fileTail(f.log, 40))
			}
		}
	}()
	start := func(f *fleetInstance) { f.a = startAppliance(t, bin, f.env, f.log, "--roles", "crawler,consumer") }
	for _, f := range fleet {
		start(f)
	}
	leader := func() *fleetInstance {
		var l *fleetInstance
		waitFor(t, 2*lease, "one leader", func() bool {
			n := 0
			for _, f := range fleet {
				if f.leads(t) {
					l, n = f, n+1
				}
			}
			return n == 1
		})
		return l
	}
	// The leader looked, found no apps and waits an interval; meanwhile
	// the group settles with all three members, so the cycle's jobs are
	// not moved between them by a rebalance.
	first := leader()
	waitFor(t, 30*time.Second, "the crawl group with three members", func() bool {
		groups, err := k.Admin().DescribeGroups(context.Background(), fleet[0].env["CRAWL_JOBS_GROUP"])
		if err != nil {
			return false
		}
		g := groups[fleet[0].env["CRAWL_JOBS_GROUP"]]
		return g.State == "Stable" && len(g.Members) == 3
	})
	pkgs := make([]string, apps)
	for i := range pkgs {
		pkgs[i] = fmt.Sprintf("com.example.fleet%02d", i)
		replay.setApp(pkgs[i], replayApp{Reviews: 100})
	}
	registerApps(t, pool, pkgs...)
	storefronts := []locale{{Lang: "fa", Country: "ir"}, {Lang: "en", Country: "us"}}
	for _, pkg := range pkgs {
		setTestStorefronts(t, pool, pkg, storefronts...)
	}
	t.Logf("leader %s; %d apps of 2 storefronts registered %s after the start", first.name, apps, time.Since(began).Round(time.Millisecond))

	cycleDone := func(id int64, timeout time.Duration) fleetCycle {
		t.Helper()
		var c fleetCycle
		waitFor(t, timeout, fmt.Sprintf("cycle %d to finish with %d app_stats rows", id, jobs), func() bool {
			cs := fleetCycles(t, pool)
			if len(cs) < int(id) {
				return false
			}
			c = cs[id-1]
			return c.finished.Year() > 1970 && c.statsRows == jobs
		})
		if c.storefronts != jobs || c.apps != apps {
			t.Errorf("cycle %d: %d distinct (app, storefront) in its %d app_stats rows, want %d; crawl_cycles.apps %d, want %d",
				id, c.storefronts, c.statsRows, jobs, c.apps, apps)
		}
		return c
	}

	// One cycle: every listing requested once in each storefront, through
	// its instance's own proxies, and the work spread over all three.
	c1 := cycleDone(1, interval+time.Minute)
	perInstance := map[string]int{}
	for _, pkg := range pkgs {
		for _, l := range storefronts {
			if n := replay.requestsIn("details", pkg, l.Lang+"/"+l.Country); n != 1 {
				t.Errorf("%s: listing requested %d times in %s/%s, want once", pkg, n, l.Country, l.Lang)
			}
		}
		vias := replay.viasOf("details", pkg)
		if len(vias) != len(storefronts) {
			t.Errorf("%s: listing requested %d times (%v), want once per storefront", pkg, len(vias), vias)
			continue
		}
		for _, via := range vias {
			perInstance[strings.SplitN(strings.TrimPrefix(via, "1.1 "), "-", 2)[0]]++
		}
	}
	for _, f := range fleet {
		if perInstance[f.name] == 0 {
			t.Errorf("%s crawled no app: %v", f.name, perInstance)
		}
	}
	waitStored(t, time.Minute, k.Brokers(), pool, fleet[0].env["CONSUMER_GROUP"])
	tt := tallyTopics(t, k.Brokers())
	checkTopicsMatchDatabase(t, tt, pool)
	// The replay store lists the same reviews in both storefronts: each is
	// stored once and recorded in both.
	if n := count(t, pool, `SELECT count(*) FROM reviews`); n != apps*reviewsPerApp {
		t.Errorf("%d reviews rows, want %d", n, apps*reviewsPerApp)
	}
	if n := count(t, pool, `SELECT count(*) FROM review_storefronts`); n != jobs*reviewsPerApp {
		t.Errorf("%d review_storefronts rows, want %d", n, jobs*reviewsPerApp)
		// Which storefronts: a reviews path that failed says why.
		rows, err := pool.Query(context.Background(), `SELECT a.package_name || ' ' || o.country || '/' || o.lang || ': ' || n.n || ' reviews, outcome ' || o.outcome || ' ' || o.error
			FROM app_crawl_outcomes o JOIN apps_registry_application a ON a.id = o.application_id,
			LATERAL (SELECT count(*) AS n FROM review_storefronts f WHERE f.application_id = o.application_id AND f.country = o.country AND f.lang = o.lang) n
			WHERE o.path = 'reviews' AND n.n <> $1`, reviewsPerApp)
		if err == nil {
			short, _ := pgx.CollectRows(rows, pgx.RowTo[string])
			t.Logf("storefronts with other than %d reviews: %v", reviewsPerApp, short)
		}
	}
	t.Logf("cycle 1: %s, jobs per instance %v", c1.finished.Sub(c1.planned).Round(time.Millisecond), perInstance)

	// midCycle waits until a cycle is under way: published, and a third to
	// two thirds of its jobs left (the fleet's job lag); it returns its id.
	midCycle := func() int64 {
		t.Helper()
		var id int64
		waitFor(t, interval+time.Minute, "a cycle under way", func() bool {
			err := pool.QueryRow(context.Background(), `SELECT id FROM crawl_cycles WHERE job_end_offsets IS NOT NULL AND finished_at IS NULL`).Scan(&id)
			if err != nil {
				return false
			}
			for _, f := range fleet {
				if f.a.running() {
					lag := f.a.metric(t, "playwatch_crawl_jobs_lag_records", "")
					return lag >= jobs/3 && lag <= 2*jobs/3
				}
			}
			return false
		})
		return id
	}
	takeover := func(old *fleetInstance, since time.Time) (*fleetInstance, time.Duration) {
		t.Helper()
		var l *fleetInstance
		waitFor(t, 3*lease, "a new leader", func() bool {
			for _, f := range fleet {
				if f != old && f.leads(t) {
					l = f
					return true
				}
			}
			return false
		})
		return l, time.Since(since)
	}

	// The leader is SIGKILLed mid-cycle.
	id := midCycle()
	first = leader()
	if err := first.a.stop(t, syscall.SIGKILL, 30*time.Second); err == nil {
		t.Fatal("the leader exited cleanly after SIGKILL")
	}
	killedAt := time.Now()
	second, took := takeover(first, killedAt)
	t.Logf("leader %s SIGKILLed mid-cycle %d; %s leads %s later (SCHEDULER_LEASE %s)", first.name, id, second.name, took.Round(time.Millisecond), lease)
	if took > lease {
		t.Errorf("the new leader took over after %s, more than SCHEDULER_LEASE %s", took, lease)
	}
	c2 := cycleDone(id, 2*time.Minute)
	t.Logf("cycle %d finished %s after its planned time, %d app_stats rows", id, c2.finished.Sub(c2.planned).Round(time.Millisecond), c2.statsRows)
	start(first) // a new process in its place

	// A non-leader is SIGKILLed mid-cycle: the others crawl its jobs in
	// the same cycle.
	id = midCycle()
	second = leader()
	var victim *fleetInstance
	for _, f := range fleet {
		if f != second && f.a.running() {
			victim = f
		}
	}
	doneBefore := victim.a.metric(t, "playwatch_crawl_jobs_done_total", "")
	if err := victim.a.stop(t, syscall.SIGKILL, 30*time.Second); err == nil {
		t.Fatal("the non-leader exited cleanly after SIGKILL")
	}
	c3 := cycleDone(id, 2*time.Minute)
	t.Logf("non-leader %s SIGKILLed mid-cycle %d after %v jobs; it finished %s after its planned time with %d app_stats rows",
		victim.name, id, doneBefore, c3.finished.Sub(c3.planned).Round(time.Millisecond), c3.statsRows)
	start(victim)

	// The leader is cut from the database (its role may not log in, its
	// sessions are ended) for longer than the lease: it cannot renew,
	// another takes over, and no cycle is planned twice.
	id = midCycle()
	second = leader()
	cutFrom := time.Now()
	if err := testPG.exec(context.Background(), "ALTER ROLE "+second.role+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	var third *fleetInstance
	for time.Since(cutFrom) < lease+lease/2 {
		if err := testPG.exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '"+second.role+"'"); err != nil {
			t.Fatal(err)
		}
		for _, f := range fleet {
			if third == nil && f != second && f.leads(t) {
				third = f
				t.Logf("leader %s cut from the database; %s leads %s after the cut (cycle %d under way)", second.name, third.name,
					time.Since(cutFrom).Round(time.Millisecond), id)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := testPG.exec(context.Background(), "ALTER ROLE "+second.role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	if third == nil {
		t.Errorf("no other instance took over within %s of cutting the leader from the database", lease+lease/2)
	}
	if second.leads(t) {
		t.Errorf("%s still leads after losing the lease", second.name)
	}
	cycleDone(id, 2*time.Minute)
	cycleDone(id+1, interval+2*time.Minute)

	// Every cycle is planned once: one per interval at most, each after the
	// previous one finished, each with exactly one app_stats row per app and
	// storefront.
	cs := fleetCycles(t, pool)
	for i, c := range cs {
		if c.finished.Year() > 1970 && (c.statsRows != jobs || c.storefronts != jobs) {
			t.Errorf("cycle %d: %d app_stats rows of %d (app, storefront), want %d", c.id, c.statsRows, c.storefronts, jobs)
		}
		if i == 0 {
			continue
		}
		p := cs[i-1]
		if c.planned.Before(p.finished) || c.planned.Before(p.planned.Add(interval)) {
			t.Errorf("cycle %d planned at %s, before cycle %d (planned %s) finished at %s or its interval passed", c.id, c.planned, p.id, p.planned, p.finished)
		}
		if c.epoch < p.epoch {
			t.Errorf("cycle %d planned under epoch %d, after cycle %d under %d", c.id, c.epoch, p.id, p.epoch)
		}
	}
	rows := 0
	for _, c := range cs {
		rows += c.statsRows
	}
	if n := count(t, pool, `SELECT count(*) FROM app_stats`); n != rows {
		t.Errorf("%d app_stats rows, %d of them at a cycle's planned time", n, rows)
	}
	t.Logf("%d cycles, epochs %v; took %s", len(cs), func() (e []int64) {
		for _, c := range cs {
			e = append(e, c.epoch)
		}
		return
	}(), time.Since(began).Round(time.Millisecond))
}
