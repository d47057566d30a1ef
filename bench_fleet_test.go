package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The fleet benchmark (`make bench-fleet`, README "Fleet benchmark"): three
// `playwatch run` servers on one Apache Kafka and one PostgreSQL, each with
// its own third of 500 proxies, crawl the replay Play Store's apps every
// CRAWL_INTERVAL; the scheduler leader is SIGKILLed at BENCH_FLEET_KILL_AT
// and started again 10 s later. It writes its report and chart to
// .cache/bench-fleet/. Never part of `make test`: it runs only under
// PLAYWATCH_BENCH_FLEET=1.

type benchFleetConfig struct {
	duration, interval, killAt time.Duration
	apps, proxies, workers     int
	gap                        time.Duration
}

func benchFleetSettings(t *testing.T) benchFleetConfig {
	c := benchFleetConfig{duration: 15 * time.Minute, interval: 5 * time.Minute, apps: 35000, proxies: 500, gap: 1750 * time.Millisecond}
	dur := func(name string, d *time.Duration) {
		if v := os.Getenv(name); v != "" {
			var err error
			if *d, err = time.ParseDuration(v); err != nil || *d <= 0 {
				t.Fatalf("%s=%q: a positive duration such as 15m", name, v)
			}
		}
	}
	num := func(name string, n *int) {
		if v := os.Getenv(name); v != "" {
			var err error
			if *n, err = strconv.Atoi(v); err != nil || *n < 3 {
				t.Fatalf("%s=%q: a whole number of at least 3", name, v)
			}
		}
	}
	dur("BENCH_FLEET_DURATION", &c.duration)
	dur("BENCH_FLEET_INTERVAL", &c.interval)
	dur("BENCH_FLEET_GAP", &c.gap)
	num("BENCH_FLEET_APPS", &c.apps)
	num("BENCH_FLEET_PROXIES", &c.proxies)
	num("BENCH_FLEET_WORKERS", &c.workers)
	c.killAt = c.duration * 7 / 15 // minute 7 of 15
	dur("BENCH_FLEET_KILL_AT", &c.killAt)
	return c
}

// fleetSample is what the benchmark saw every 10 s.
type fleetSample struct {
	at                time.Time
	responses, ok     int64 // store answers in the 10 s before at
	healthy, queue    float64
	up                int                // servers answering /metrics
	cpu               map[string]float64 // seconds of CPU used so far, by process
	machineBusy, wall float64            // the machine's busy CPU seconds and wall seconds so far
}

func TestBenchFleet(t *testing.T) {
	if os.Getenv("PLAYWATCH_BENCH_FLEET") != "1" {
		t.Skip("the fleet benchmark runs under `make bench-fleet` (PLAYWATCH_BENCH_FLEET=1)")
	}
	cfg := benchFleetSettings(t)
	outDir := filepath.Join(".cache", "bench-fleet")
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("fleet benchmark: %d apps, %d proxies, CRAWL_INTERVAL %s, %s, leader killed at %s; load before: %s",
		cfg.apps, cfg.proxies, cfg.interval, cfg.duration, cfg.killAt, loadAverage())

	k := apacheKafkaCluster(t, 1)
	clearPlaywatchTopics(t, k.Admin())
	bin := buildPlaywatch(t)
	replay := newReplayPlayStore(t)
	store := newBenchStore(t, replay)
	profiles := benchProfiles(cfg.proxies, rand.New(rand.NewPCG(25, 1)))
	proxies := startBenchProxies(t, profiles, 25)
	dbURL := newTestDatabase(t)
	pool := newTestPoolFor(t, dbURL)
	run := fmt.Sprint(time.Now().UnixNano())

	// Apps of 20 reviews and one new one each, so that every cycle reads
	// one reviews page (the first one in full, then incrementally) and no
	// generated page is cached: the store would hold one per app and cookie.
	pkgs := make([]string, cfg.apps)
	for i := range pkgs {
		pkgs[i] = fmt.Sprintf("com.example.fleet%05d", i)
		replay.setApp(pkgs[i], replayApp{Reviews: 20, New: 1, Replies: -1})
	}

	const servers = 3
	fleet := make([]*fleetInstance, servers)
	for i := range fleet {
		var urls []string
		for j := i; j < len(proxies.all); j += servers {
			urls = append(urls, proxies.all[j].URL)
		}
		name := fmt.Sprintf("server%d", i+1)
		fleet[i] = &fleetInstance{name: name, log: filepath.Join(outDir, name+".log"), env: map[string]string{
			"DATABASE_URL":         dbURL,
			"KAFKA_BROKERS":        strings.Join(k.Brokers(), ","),
			"PLAYWATCH_DATA_DIR":   t.TempDir(),
			"PLAYWATCH_HTTP_ADDR":  freeAddr(t),
			"PLAYSTORE_URL":        store.URL,
			"PROXIES":              strings.Join(urls, ","),
			"RATE_LIMIT_REQUESTS":  "0",
			"EGRESS_MIN_GAP":       cfg.gap.String(),
			"EGRESS_MAX_IN_FLIGHT": "1",
			"REVIEWS_PER_APP":      "20",
			"CRAWL_INTERVAL":       cfg.interval.String(),
			"CRAWL_NEW_APP_CHECK":  "1h",
			"SCHEDULER_LEASE":      "10s",
			"CONSUMER_GROUP":       "fleet-storage-" + run,
			"CRAWL_JOBS_GROUP":     "fleet-crawl-" + run,
			"LOG_LEVEL":            "warn",
		}}
		if cfg.workers != 0 { // else the servers' own CRAWL_WORKERS=auto
			fleet[i].env["CRAWL_WORKERS"] = strconv.Itoa(cfg.workers)
		}
		os.Remove(fleet[i].log)
	}
	// The servers' CRAWL_WORKERS, as the first (the largest third of the
	// proxies) reads its settings.
	server1, err := loadTestConfig(fleet[0].env)
	if err != nil {
		t.Fatal(err)
	}
	// The apps are registered first: the leader plans the first cycle as
	// soon as it leads.
	if _, err := pool.Exec(context.Background(), `INSERT INTO apps_registry_application (package_name) SELECT unnest($1::text[])`, pkgs); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	store.began, proxies.began = began, began // before any request: the run's clock
	start := func(f *fleetInstance) { f.a = startAppliance(t, bin, f.env, f.log, "--roles", "crawler,consumer") }
	for _, f := range fleet {
		start(f)
	}
	t.Logf("%d apps registered, three servers up after %s", len(pkgs), time.Since(began).Round(time.Millisecond))

	pgPID := postmasterPID()
	kafkaPGID := 0
	k.mu.Lock()
	for _, n := range k.running {
		kafkaPGID = n.cmd.Process.Pid
	}
	k.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()

	// New reviews appear on the store at a steady pace, on random apps;
	// freshness is the time from then until the review's row is stored.
	var appearedMu sync.Mutex
	appeared := map[string]time.Time{}
	newReviews := map[string]int{} // each app starts with one (replayApp.New)
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(25, 2))
		everyTick(ctx, 5*time.Second, func(time.Time) {
			for range 10 {
				pkg := pkgs[rng.IntN(len(pkgs))]
				replay.addReviews(pkg, 1)
				newReviews[pkg]++
				id := replayReviewID(pkg, -(1 + newReviews[pkg]))
				appearedMu.Lock()
				appeared[id] = time.Now()
				appearedMu.Unlock()
			}
		})
	})

	// Every 10 s: store answers, healthy proxies, queue depth, CPU.
	var samplesMu sync.Mutex
	var samples []fleetSample
	cpuBase := map[string]float64{} // CPU of a server's killed process
	busy0, _ := machineCPU()
	wg.Go(func() {
		everyTick(ctx, 10*time.Second, func(now time.Time) {
			s := fleetSample{at: now, cpu: map[string]float64{}}
			sec := int(now.Sub(began) / time.Second)
			s.responses, s.ok = store.answers(sec-10, sec)
			// The servers are scraped at once, so that three slow answers
			// still fit in the 10 s between samples.
			var scrapes sync.WaitGroup
			for _, f := range fleet {
				if f.a == nil || !f.a.running() {
					continue
				}
				// The CPU first: a server whose /metrics is slow to answer
				// under load still counts in the report's CPU line.
				samplesMu.Lock()
				s.cpu[f.name] = cpuBase[f.name] + pidCPU(f.a.cmd.Process.Pid)
				samplesMu.Unlock()
				base := f.a.base
				scrapes.Go(func() {
					m, err := fetchMetrics(base)
					if err != nil {
						return
					}
					samplesMu.Lock()
					defer samplesMu.Unlock()
					s.up++
					s.healthy += m["playwatch_proxy_healthy"]
					s.queue = max(s.queue, m["playwatch_crawl_jobs_lag_records"])
				})
			}
			scrapes.Wait()
			s.cpu["postgresql"] = childrenCPU(pgPID)
			s.cpu["kafka"] = groupCPU(kafkaPGID)
			s.cpu["bench (store, proxies)"] = pidCPU(os.Getpid())
			busy, _ := machineCPU()
			s.machineBusy, s.wall = busy-busy0, now.Sub(began).Seconds()
			samplesMu.Lock()
			samples = append(samples, s)
			samplesMu.Unlock()
		})
	})

	// The scheduler leader is SIGKILLed and started again 10 s later.
	sleepUntil := func(at time.Time) {
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
	}
	sleepUntil(began.Add(cfg.killAt))
	var leader *fleetInstance
	for _, f := range fleet {
		if f.leads(t) {
			leader = f
		}
	}
	var killedAt time.Time
	takeover := time.Duration(-1)
	if leader == nil {
		t.Errorf("no leader at %s", cfg.killAt)
	} else {
		cpu := pidCPU(leader.a.cmd.Process.Pid)
		if err := leader.a.stop(t, syscall.SIGKILL, 30*time.Second); err == nil {
			t.Fatal("the leader exited cleanly after SIGKILL")
		}
		killedAt = time.Now()
		samplesMu.Lock()
		cpuBase[leader.name] += cpu
		samplesMu.Unlock()
		tookOver := make(chan time.Duration, 1)
		go func() {
			for time.Since(killedAt) < 2*time.Minute {
				for _, f := range fleet {
					if f == leader || !f.a.running() {
						continue
					}
					if m, err := fetchMetrics(f.a.base); err == nil && m["playwatch_scheduler_leader"] == 1 {
						tookOver <- time.Since(killedAt)
						return
					}
				}
				time.Sleep(200 * time.Millisecond)
			}
			tookOver <- -1
		}()
		sleepUntil(killedAt.Add(10 * time.Second))
		start(leader) // the same proxies, a new process
		takeover = <-tookOver
		t.Logf("leader %s SIGKILLed at %s and started again 10 s later; a new leader after %s",
			leader.name, killedAt.Sub(began).Round(time.Second), takeover.Round(time.Millisecond))
	}
	sleepUntil(began.Add(cfg.duration))
	cancel()
	wg.Wait()
	ended := time.Now()

	// Freshness of the reviews that appeared at least an interval and a
	// minute before the end (later ones may not have been read yet); one
	// not stored counts as stored at the end.
	ids := make([]string, 0, len(appeared))
	for id := range appeared {
		ids = append(ids, id)
	}
	stored := map[string]time.Time{}
	rows, err := pool.Query(context.Background(), `SELECT review_id, first_seen_at FROM reviews WHERE review_id = ANY($1)`, ids)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		stored[id] = at
	}
	rows.Close()
	var fresh []time.Duration
	unstored := 0
	for id, at := range appeared {
		if ended.Sub(at) < cfg.interval+time.Minute {
			continue
		}
		s, ok := stored[id]
		if !ok {
			unstored++
			s = ended
		}
		fresh = append(fresh, s.Sub(at))
	}
	slices.Sort(fresh)

	var cycleStarts []int32
	cycles := fleetCycles(t, pool)
	for _, c := range cycles {
		cycleStarts = append(cycleStarts, int32(c.planned.Sub(began)/time.Second))
	}
	slices.Sort(cycleStarts)

	r := fleetReport{cfg: cfg, servers: servers, crawlWorkers: server1.CrawlWorkers, began: began, ended: ended, killedAt: killedAt, leaderTakeover: takeover, samples: samples,
		cycles: len(cycles), fresh: fresh, unstored: unstored}
	r.violations, r.overlaps, r.minGap = proxies.violations()
	killSec := int32(killedAt.Sub(began) / time.Second)
	if killedAt.IsZero() {
		killSec = -1000
	}
	r.twice, r.twiceTakeover = store.crawledTwice(cycleStarts, killSec, killSec+120)
	r.p50, r.p95, r.p99 = proxies.latencyQuantiles()
	all, ok := store.answers(0, int(ended.Sub(began)/time.Second))
	r.answers, r.oks = all, ok
	for _, p := range proxies.all {
		p.mu.Lock()
		r.throttled += p.throttled
		p.mu.Unlock()
	}
	r.stored = count(t, pool, `SELECT count(*) FROM app_stats`)
	text := r.write(t, outDir)
	fmt.Println(r.summary())
	t.Logf("report in %s:\n%s", outDir, text)
}

// fleetReport computes the benchmark's figures from its samples.
type fleetReport struct {
	cfg                  benchFleetConfig
	servers              int
	crawlWorkers         int // each server's
	began, ended         time.Time
	killedAt             time.Time
	leaderTakeover       time.Duration
	samples              []fleetSample
	violations, twice    int
	overlaps             int
	minGap               time.Duration
	twiceTakeover        int
	throttled, unstored  int
	cycles, stored       int
	answers, oks         int64
	fresh                []time.Duration
	p50, p95, p99        time.Duration
	responsesPerS        float64
	successCV            float64
	healthyMin, queueMax float64
	takeoverLost         float64
}

// The takeover's cost counts what the fleet missed while jobs waited, not
// a cycle's end, when it had run out of jobs.
func TestFleetReportTakeoverLost(t *testing.T) {
	began := time.Now()
	r := fleetReport{servers: 3, crawlWorkers: 48, began: began, killedAt: began.Add(125 * time.Second)}
	for sec := 10; sec <= 300; sec += 10 {
		s := fleetSample{at: began.Add(time.Duration(sec) * time.Second), responses: 2600, queue: 10000, up: 3}
		switch sec {
		case 130: // the kill: half the rate, jobs waiting
			s.responses = 1300
		case 150, 160: // the cycle's jobs are done: nothing to crawl
			s.responses, s.queue = 0, 0
		case 170: // the last in flight, fewer than the workers hold
			s.responses, s.queue = 900, 100
		}
		r.samples = append(r.samples, s)
	}
	r.compute()
	if r.takeoverLost != 5 {
		t.Errorf("takeover lost %v s, want 5 (half of the 10 s after the kill)", r.takeoverLost)
	}
}

// compute derives the summary figures: the rate over the run after its
// first minute (the fleet's ramp-up), the per-minute coefficient of
// variation of the 200s outside the takeover (the minutes from the kill
// to two minutes after it), and the throughput the takeover cost: seconds
// of the rate before the kill missing in the three minutes after it, in
// the 10-s samples that end with more jobs queued than the servers' workers
// can hold, so that jobs waited throughout: a cycle's end, when the fleet
// has run out of jobs, costs nothing.
func (r *fleetReport) compute() {
	var rates []float64
	r.healthyMin, r.queueMax = math.Inf(1), 0
	var baseline []float64
	lost := 0.0
	for _, s := range r.samples {
		rate := float64(s.responses) / 10
		if s.at.Sub(r.began) > time.Minute {
			rates = append(rates, rate)
		}
		if s.up == 3 { // while a server is down its proxies are not counted
			r.healthyMin = math.Min(r.healthyMin, s.healthy)
		}
		r.queueMax = math.Max(r.queueMax, s.queue)
		if !r.killedAt.IsZero() && s.at.Before(r.killedAt) && s.at.After(r.killedAt.Add(-2*time.Minute)) {
			baseline = append(baseline, rate)
		}
	}
	if math.IsInf(r.healthyMin, 1) {
		r.healthyMin = 0
	}
	if len(baseline) > 0 {
		base := median(baseline)
		for _, s := range r.samples {
			if s.at.After(r.killedAt) && s.at.Before(r.killedAt.Add(3*time.Minute+time.Second)) && base > 0 &&
				s.queue > float64(r.servers*r.crawlWorkers) {
				lost += math.Max(0, base-float64(s.responses)/10) / base * 10
			}
		}
	}
	r.takeoverLost = lost
	if len(rates) > 0 {
		sum := 0.0
		for _, v := range rates {
			sum += v
		}
		r.responsesPerS = sum / float64(len(rates))
	}
	// Per-minute 200s, whole minutes after the first, outside the takeover.
	var perMinute []float64
	for m := 1; ; m++ {
		from, to := r.began.Add(time.Duration(m)*time.Minute), r.began.Add(time.Duration(m+1)*time.Minute)
		if to.After(r.ended) {
			break
		}
		if !r.killedAt.IsZero() && to.After(r.killedAt) && from.Before(r.killedAt.Add(2*time.Minute)) {
			continue
		}
		n := 0.0
		for _, s := range r.samples {
			if s.at.After(from) && !s.at.After(to) {
				n += float64(s.ok)
			}
		}
		perMinute = append(perMinute, n)
	}
	r.successCV = coefficientOfVariation(perMinute)
}

func (r *fleetReport) freshP95() time.Duration {
	if len(r.fresh) == 0 {
		return 0
	}
	return r.fresh[min(len(r.fresh)*95/100, len(r.fresh)-1)]
}

func (r *fleetReport) summary() string {
	return fmt.Sprintf("fleet: responses/s=%.1f success_cv=%.1f%% p50=%s p95=%s p99=%s healthy_proxies_min=%.0f queue_depth_max=%.0f freshness_p95=%s budget_violations=%d apps_crawled_twice=%d takeover_s=%.0f",
		r.responsesPerS, r.successCV*100, r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.p99.Round(time.Millisecond),
		r.healthyMin, r.queueMax, r.freshP95().Round(time.Second), r.violations, r.twice, r.takeoverLost)
}

// cpuCores is the average CPU (in cores) each process used over the run.
func (r *fleetReport) cpuCores() (names []string, cores map[string]float64, machine float64) {
	cores = map[string]float64{}
	if len(r.samples) < 2 {
		return nil, cores, 0
	}
	first, last := r.samples[0], r.samples[len(r.samples)-1]
	wall := last.wall - first.wall
	for name, v := range last.cpu {
		if wall > 0 {
			cores[name] = (v - first.cpu[name]) / wall
		}
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return int(math.Copysign(1, cores[b]-cores[a])) })
	if wall > 0 {
		machine = (last.machineBusy - first.machineBusy) / wall
	}
	return names, cores, machine
}

// bottleneck names what held the rate under the goal: the CPU of the
// machine (and whose) when it was saturated, else the proxies' pacing.
func (r *fleetReport) bottleneck() string {
	if r.responsesPerS >= 231 {
		return "none: the goal of 231 responses/s was reached"
	}
	names, cores, machine := r.cpuCores()
	var top []string
	for _, n := range names {
		top = append(top, fmt.Sprintf("%s %.2f", n, cores[n]))
	}
	ours := 0.0
	for _, c := range cores {
		ours += c
	}
	capacity := float64(r.healthyMin) / r.cfg.gap.Seconds()
	if machine >= 0.85*float64(cpuCount()) {
		return fmt.Sprintf("CPU: the machine was busy %.2f of %d cores (%.2f of them the benchmark's processes, %.2f other work); by process (cores): %s; %.1f responses/s reached",
			machine, cpuCount(), ours, math.Max(0, machine-ours), strings.Join(top, ", "), r.responsesPerS)
	}
	return fmt.Sprintf("pacing: at least %.0f healthy proxies at EGRESS_MIN_GAP %s allow %.0f requests/s; the machine was busy %.2f of %d cores (by process: %s); %.1f responses/s reached",
		r.healthyMin, r.cfg.gap, capacity, machine, cpuCount(), strings.Join(top, ", "), r.responsesPerS)
}

// write puts report.md and fleet.svg in dir and returns the report.
func (r *fleetReport) write(t *testing.T, dir string) string {
	r.compute()
	goal := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# Fleet benchmark, %s\n\n%s\n\n", r.began.UTC().Format("2 Jan 2006 15:04 UTC"), r.summary())
	fmt.Fprintf(&b, "%d apps, %d proxies over 3 servers, CRAWL_INTERVAL %s, EGRESS_MIN_GAP %s, CRAWL_WORKERS %d, %s run, %d cycles planned; load average at the end %s.\n\n",
		r.cfg.apps, r.cfg.proxies, r.cfg.interval, r.cfg.gap, r.crawlWorkers, r.ended.Sub(r.began).Round(time.Second), r.cycles, loadAverage())
	fmt.Fprintf(&b, "| figure | measured | goal | met |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| store responses/s (after minute 1) | %.1f | ≥ 231 | %s |\n", r.responsesPerS, goal(r.responsesPerS >= 231))
	fmt.Fprintf(&b, "| per-minute success CV outside the takeover | %.1f %% | ≤ 5 %% | %s |\n", r.successCV*100, goal(r.successCV <= 0.05))
	fmt.Fprintf(&b, "| latency p50 / p95 / p99 (relayed 200s) | %s / %s / %s | | |\n", r.p50.Round(time.Millisecond), r.p95.Round(time.Millisecond), r.p99.Round(time.Millisecond))
	fmt.Fprintf(&b, "| healthy proxies, least | %.0f | | |\n", r.healthyMin)
	fmt.Fprintf(&b, "| crawl-jobs queue depth, most | %.0f | | |\n", r.queueMax)
	fmt.Fprintf(&b, "| freshness p95 (%d reviews, %d not stored by the end) | %s | ≤ %s | %s |\n", len(r.fresh), r.unstored, r.freshP95().Round(time.Second), r.cfg.interval+time.Minute, goal(len(r.fresh) > 0 && r.freshP95() <= r.cfg.interval+time.Minute))
	fmt.Fprintf(&b, "| budget violations (429 from a proxy's pacing; %d of them overlapping another request; shortest gap between two arrivals %s) | %d | 0 | %s |\n",
		r.overlaps, r.minGap.Round(time.Millisecond), r.violations, goal(r.violations == 0))
	fmt.Fprintf(&b, "| apps crawled twice in a cycle (%d of them in the 2 min after the kill) | %d | 0 | %s |\n", r.twiceTakeover, r.twice, goal(r.twice == 0))
	fmt.Fprintf(&b, "| takeover: throughput lost (new leader after %s) | %.0f s | ≤ 30 s | %s |\n", r.leaderTakeover.Round(100*time.Millisecond), r.takeoverLost, goal(r.leaderTakeover >= 0 && r.takeoverLost <= 30))
	fmt.Fprintf(&b, "| store answers / 200s / throttled by a proxy's profile | %d / %d / %d | | |\n", r.answers, r.oks, r.throttled)
	fmt.Fprintf(&b, "| app_stats rows stored | %d | | |\n\n", r.stored)
	names, cores, machine := r.cpuCores()
	fmt.Fprintf(&b, "CPU over the run (cores of %d; the machine was busy %.2f): ", cpuCount(), machine)
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.2f", n, cores[n])
	}
	fmt.Fprintf(&b, ".\n\nBottleneck: %s.\n", r.bottleneck())
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "fleet.svg"), r.chart(t), 0o644); err != nil {
		t.Fatal(err)
	}
	// The samples themselves, for another look without another run.
	var csv strings.Builder
	csv.WriteString("seconds,responses,ok,healthy_proxies,queue_depth,servers_up\n")
	for _, s := range r.samples {
		fmt.Fprintf(&csv, "%.0f,%d,%d,%.0f,%.0f,%d\n", s.at.Sub(r.began).Seconds(), s.responses, s.ok, s.healthy, s.queue, s.up)
	}
	if err := os.WriteFile(filepath.Join(dir, "samples.csv"), []byte(csv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// chart draws responses/s per 10 s, healthy proxies and queue depth with
// the status page's chart code, one chart under the other in one SVG.
func (r *fleetReport) chart(t *testing.T) []byte {
	var responses, healthy, queue []timeValue
	for _, s := range r.samples {
		responses = append(responses, timeValue{s.at, float64(s.responses) / 10})
		// A sample in which a server did not answer /metrics (within 5 s
		// on a saturated machine, or while it is down) would draw its
		// proxies as lost: the proxies are drawn from full samples only.
		if s.up == 3 {
			healthy = append(healthy, timeValue{s.at, s.healthy})
		}
		if s.up > 0 {
			queue = append(queue, timeValue{s.at, s.queue})
		}
	}
	var marks []timeMark
	if !r.killedAt.IsZero() {
		marks = []timeMark{{T: r.killedAt, Label: "leader killed", Title: "the scheduler leader SIGKILLed"}}
	}
	format := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
	charts := []chart{
		withMarks(timeSeriesChart(newChart("responses", "Store responses per second, per 10 s", "responses/s"), r.began, r.ended,
			[]namedSeries{{Name: "responses/s", Class: "s-download", Values: responses}}, 0, math.NaN(), format), marks),
		withMarks(timeSeriesChart(newChart("healthy", "Healthy proxies", "proxies"), r.began, r.ended,
			[]namedSeries{{Name: "healthy proxies", Class: "s-rating", Values: healthy}}, 0, math.NaN(), format), marks),
		withMarks(timeSeriesChart(newChart("queue", "Crawl-jobs queue depth", "jobs"), r.began, r.ended,
			[]namedSeries{{Name: "queue depth", Class: "s-installs", Values: queue}}, 0, math.NaN(), format), marks),
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d"><style>%s</style><rect width="100%%" height="100%%" fill="#fff"/>`,
		chartWidth, (chartHeight+24)*len(charts), chartWidth, (chartHeight+24)*len(charts), statusCSS)
	for i, c := range charts {
		var fig bytes.Buffer
		if err := statusTemplates.ExecuteTemplate(&fig, "chart", c); err != nil {
			t.Fatal(err)
		}
		svg := fig.String()
		from, to := strings.Index(svg, "<svg"), strings.LastIndex(svg, "</svg>")
		if from < 0 || to < 0 {
			t.Fatalf("chart %s drew no svg:\n%s", c.ID, svg)
		}
		y := i * (chartHeight + 24)
		fmt.Fprintf(&out, `<text x="8" y="%d" font-family="sans-serif" font-size="13">%s (%s)</text>`, y+16, c.Title, c.Unit)
		fmt.Fprintf(&out, `<svg x="0" y="%d" width="%d" height="%d"`, y+22, chartWidth, chartHeight)
		out.WriteString(strings.TrimPrefix(svg[from:to+len("</svg>")], "<svg"))
	}
	out.WriteString("</svg>\n")
	return out.Bytes()
}

func coefficientOfVariation(v []float64) float64 {
	if len(v) < 2 {
		return 0
	}
	mean := 0.0
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	if mean == 0 {
		return 0
	}
	ss := 0.0
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss/float64(len(v)-1)) / mean
}

// fetchMetrics reads base's /metrics into sample → value (no test failure:
// a server may be down while it is being killed). The timeout stays under
// the 10 s between samples (the servers are scraped at once), but is
// generous: with 35,000 apps a scrape renders about 70,000 per-app series
// on a machine the fleet keeps busy.
func fetchMetrics(base string) (map[string]float64, error) {
	cl := http.Client{Timeout: 9 * time.Second}
	resp, err := cl.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// procStat returns fields of /proc/PID/stat after the command name: [0] is
// the state, [1] the parent, [2] the process group, [11]/[12] utime/stime.
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

const clockTicks = 100 // USER_HZ on Linux

func statCPU(f []string) float64 {
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / clockTicks
}

func pidCPU(pid int) float64 { return statCPU(procStat(pid)) }

// childrenCPU is the CPU of pid and its children (PostgreSQL's backends).
func childrenCPU(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	return sumProcs(func(p int, f []string) bool { return p == pid || f[1] == strconv.Itoa(pid) })
}

// groupCPU is the CPU of the processes of process group pgid (a Kafka node:
// its script and JVM).
func groupCPU(pgid int) float64 {
	if pgid <= 0 {
		return 0
	}
	return sumProcs(func(_ int, f []string) bool { return f[2] == strconv.Itoa(pgid) })
}

func sumProcs(match func(pid int, f []string) bool) float64 {
	ents, _ := os.ReadDir("/proc")
	total := 0.0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(pid); len(f) >= 13 && match(pid, f) {
			total += statCPU(f)
		}
	}
	return total
}

// machineCPU is the machine's busy CPU seconds since boot (/proc/stat).
func machineCPU() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	busy := 0.0
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / clockTicks, nil
}

func cpuCount() int {
	b, _ := os.ReadFile("/proc/stat")
	n := 0
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "cpu") && !strings.HasPrefix(line, "cpu ") {
			n++
		}
	}
	return max(n, 1)
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// postmasterPID is the test cluster's postmaster, from its postmaster.pid.
func postmasterPID() int {
	if testPG.dir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(testPG.dir, "pg", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}
