package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A crowd reloading the status page of a filled appliance costs the control
// path nothing: 64 clients reload / for 30 s while reviews keep arriving;
// the scheduler lease never changes hands, /readyz stays 200 and the
// consumer keeps storing. Before the page had its own connections, its
// reads took every connection of the one pool: the lease was lost within
// seconds, /readyz answered 503 and nothing was stored meanwhile.
func TestFaultStatusPageCrowd(t *testing.T) {
	requireFaultSuite(t)
	const apps, reviewsPerApp, clients, load = 40, 7500, 64, 30 * time.Second
	dbURL := newTestDatabase(t)
	seed := newTestPoolFor(t, dbURL)
	// 200 hourly listings and reviewsPerApp reviews of the last 48 h each
	// (a crawler stores the newest: half are in the overview's last 24 h).
	seedStatusVolume(t, seed, apps, reviewsPerApp, 200, time.Now(), 48*time.Hour)
	replay := newReplayPlayStore(t)
	for i := 1; i <= apps; i++ {
		replay.setApp(fmt.Sprintf("com.example.bulk%d", i), replayApp{Reviews: 20})
	}
	dir := tempDataDir(t)
	a := startE2EAppliance(t, applianceEnv(t, filepath.Join(dir, "data"), map[string]string{
		"DATABASE_URL":        dbURL,
		"PLAYSTORE_URL":       replay.URL,
		"RATE_LIMIT_REQUESTS": "0",
		"EGRESS_MIN_GAP":      "0s",
		"SCHEDULER_LEASE":     "8s",
		"LOG_LEVEL":           "warn",
	}))
	t.Cleanup(func() { _ = a.stop() })
	type lease struct {
		holder string
		epoch  int64
	}
	readLease := func() (l lease) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := a.pool.QueryRow(ctx, `SELECT holder, epoch FROM scheduler_lease WHERE name = 'crawl'`).Scan(&l.holder, &l.epoch); err != nil {
			t.Logf("read the lease: %v", err)
		}
		return l
	}
	waitFor(t, 30*time.Second, "the appliance to take the scheduler lease", func() bool { return readLease().epoch > 0 })
	before := readLease()

	ctx, stop := context.WithTimeout(context.Background(), load)
	defer stop()
	var wg sync.WaitGroup
	var pages, busy, other atomic.Int64
	client := &http.Client{Timeout: 20 * time.Second}
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				resp, err := client.Get(a.base + "/")
				if err != nil {
					other.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					pages.Add(1)
				case http.StatusServiceUnavailable:
					busy.Add(1)
					if resp.Header.Get("Retry-After") == "" {
						other.Add(1) // a 503 that does not say when to come back
					}
				default:
					other.Add(1)
				}
			}
		})
	}

	// Reviews arrive all along: a batch of 20 every 500 ms.
	var produced atomic.Int64
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			var recs []*kgo.Record
			for j := range 20 {
				pkg := fmt.Sprintf("com.example.bulk%d", 1+(i+j)%apps)
				recs = append(recs, rec(topicReviews, pkg, msgJSON(reviewFields(pkg, fmt.Sprintf("crowd-%d-%d", i, j), time.Now()))))
			}
			pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := a.client.ProduceSync(pctx, recs...).FirstErr(); err != nil {
				t.Errorf("produce: %v", err)
			}
			cancel()
			produced.Add(int64(len(recs)))
			_ = sleepOn(ctx, systemClock{}, 500*time.Millisecond) // ends with the load
		}
	})

	storedNow := func(p *pgxpool.Pool) int {
		qctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var n int
		if err := p.QueryRow(qctx, `SELECT count(*) FROM reviews WHERE review_id LIKE 'crowd-%'`).Scan(&n); err != nil {
			t.Logf("count stored reviews: %v", err)
			return -1
		}
		return n
	}
	probe := &http.Client{Timeout: 5 * time.Second}
	started := time.Now()
	var producedAt []int64 // produced, at each second of the load
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for ; ctx.Err() == nil; <-tick.C {
		producedAt = append(producedAt, produced.Load())
		resp, err := probe.Get(a.base + "/readyz")
		switch {
		case err != nil:
			t.Errorf("%v into the load: /readyz: %v", time.Since(started).Round(time.Second), err)
		default:
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%v into the load: /readyz %d %s", time.Since(started).Round(time.Second), resp.StatusCode, body)
			}
		}
		if l := readLease(); l != before {
			t.Errorf("%v into the load: the lease is %+v, was %+v", time.Since(started).Round(time.Second), l, before)
		}
		// What was produced 8 s ago is stored by now: the consumer keeps up.
		if n := len(producedAt); n > 8 {
			if stored, want := storedNow(a.pool), producedAt[n-9]; stored < int(want) {
				t.Errorf("%v into the load: %d of the reviews produced 8 s before stored, want %d", time.Since(started).Round(time.Second), stored, want)
			}
		}
	}
	wg.Wait()
	t.Logf("%d clients for %v: %d pages drawn, %d answered 503, %d other answers or errors; %d reviews produced",
		clients, load, pages.Load(), busy.Load(), other.Load(), produced.Load())
	if pages.Load() == 0 || busy.Load() == 0 {
		t.Errorf("pages %d, 503s %d: want both", pages.Load(), busy.Load())
	}
	if other.Load() > 0 {
		t.Errorf("%d answers that were neither a page nor a 503 with Retry-After", other.Load())
	}
	waitFor(t, 30*time.Second, "every review produced during the load to be stored", func() bool {
		return storedNow(a.pool) == int(produced.Load())
	})
	if l := readLease(); l != before {
		t.Errorf("after the load the lease is %+v, was %+v", l, before)
	}
}
