package main

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// waitAsync runs b.Wait in a goroutine and returns its result channel.
func bucketWaitAsync(ctx context.Context, b *tokenBucket) <-chan error {
	done := make(chan error, 1)
	go func() { done <- b.Wait(ctx) }()
	return done
}

func receiveWait(t *testing.T, c <-chan error) error {
	t.Helper()
	select {
	case err := <-c:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return")
		return nil
	}
}

// spentBucket is a bucket of 10 tokens a minute on clk whose burst of 10
// is used up.
func spentBucket(t *testing.T, clk *fakeClock, random func() float64) *tokenBucket {
	t.Helper()
	b := newTokenBucket(10, time.Minute, clk, random)
	for i := range 10 {
		if err := b.Wait(context.Background()); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
	}
	return b
}

// waitSleeps has b.Wait sleep exactly want on clk, then return without an
// error.
func waitSleeps(t *testing.T, ctx context.Context, b *tokenBucket, clk *fakeClock, want time.Duration) {
	t.Helper()
	done := bucketWaitAsync(ctx, b)
	if d := clk.nextTimer(t); d != want {
		t.Fatalf("sleep %v, want %v", d, want)
	}
	clk.Advance(want)
	if err := receiveWait(t, done); err != nil {
		t.Fatal(err)
	}
}

func TestRateBucketBurstThenOneTokenPerInterval(t *testing.T) {
	clk := newFakeClock(false)
	b := spentBucket(t, clk, fixedRandom(0))
	clk.noTimer(t) // the burst never sleeps
	ctx := context.Background()

	done := bucketWaitAsync(ctx, b)
	if d := clk.nextTimer(t); d != 6*time.Second {
		t.Fatalf("11th request sleeps %v, want 6s (60s/10)", d)
	}
	clk.Advance(6*time.Second - time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v before the token was due", err)
	default:
	}
	clk.Advance(time.Millisecond)
	if err := receiveWait(t, done); err != nil {
		t.Fatal(err)
	}
}

func TestRateJitterIsAddedButNotCharged(t *testing.T) {
	clk := newFakeClock(false)
	b := spentBucket(t, clk, fixedRandom(0.5))
	ctx := context.Background()
	// Due in 6 s, plus half of the maximal jitter (half an interval: 3 s).
	waitSleeps(t, ctx, b, clk, 7500*time.Millisecond)
	// The next token is due 6 s after the previous one was (at 12 s), not
	// 6 s after the jittered wake-up: 4.5 s from now, plus 1.5 s jitter.
	waitSleeps(t, ctx, b, clk, 6*time.Second)
}

func TestRateJitterMakesGapsIrregular(t *testing.T) {
	clk := newFakeClock(true)
	b := newTokenBucket(10, time.Minute, clk, nil)
	ctx := context.Background()
	for range 40 {
		if err := b.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waits := clk.allWaits()
	if len(waits) != 30 {
		t.Fatalf("%d sleeps, want 30 (40 requests minus a burst of 10)", len(waits))
	}
	var total time.Duration
	for _, w := range waits {
		if w < 3*time.Second || w > 9*time.Second {
			t.Errorf("gap %v outside 6s±3s", w)
		}
		total += w
	}
	if slices.Min(waits) == slices.Max(waits) {
		t.Error("all gaps equal: no jitter")
	}
	// The average stays at one request per 6 s.
	if avg := total / 30; avg < 5*time.Second || avg > 7*time.Second {
		t.Errorf("average gap %v, want about 6s", avg)
	}
}

func TestRateConcurrentWaitersAreQueuedNotSpinning(t *testing.T) {
	clk := newFakeClock(false)
	b := newTokenBucket(10, time.Minute, clk, fixedRandom(0))
	ctx := context.Background()
	const n = 60
	var wg sync.WaitGroup
	var mu sync.Mutex
	returned := 0
	for range n {
		wg.Go(func() {
			if err := b.Wait(ctx); err != nil {
				t.Error(err)
			}
			mu.Lock()
			returned++
			mu.Unlock()
		})
	}
	var sleeps []time.Duration
	for range n - 10 {
		sleeps = append(sleeps, clk.nextTimer(t))
	}
	slices.Sort(sleeps)
	for i, d := range sleeps {
		if want := time.Duration(i+1) * 6 * time.Second; d != want {
			t.Fatalf("waiter %d sleeps %v, want %v", i, d, want)
		}
	}
	clk.Advance(n * 6 * time.Second)
	wg.Wait()
	if returned != n {
		t.Fatalf("%d returned", returned)
	}
}

func TestRateCancelGivesTheTokenBack(t *testing.T) {
	clk := newFakeClock(false)
	b := spentBucket(t, clk, fixedRandom(0))
	ctx, cancel := context.WithCancel(context.Background())
	done := bucketWaitAsync(ctx, b)
	clk.nextTimer(t)
	cancel()
	if err := receiveWait(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	// The canceled reservation is returned: the next caller waits 6 s, not 12 s.
	waitSleeps(t, context.Background(), b, clk, 6*time.Second)
}

func TestRateDeadlineTooShortFailsAtOnce(t *testing.T) {
	clk := newFakeClock(false)
	b := newTokenBucket(1, time.Hour, clk, fixedRandom(0))
	_ = b.Wait(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded without waiting", err)
	}
	clk.noTimer(t)
}

func TestRateZeroIsUnlimited(t *testing.T) {
	clk := newFakeClock(false)
	b := newTokenBucket(0, time.Minute, clk, nil)
	for range 10000 {
		if err := b.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	clk.noTimer(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled context: %v", err)
	}
}
