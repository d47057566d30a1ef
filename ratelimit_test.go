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

func TestRateBucketBurstThenOneTokenPerInterval(t *testing.T) {
	clk := newFakeClock(false)
	b := newTokenBucket(10, time.Minute, clk, fixedRandom(0))
	ctx := context.Background()
	for i := range 10 {
		if err := b.Wait(ctx); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
	}
	clk.noTimer(t) // the burst never sleeps

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
	b := newTokenBucket(10, time.Minute, clk, fixedRandom(0.5))
	ctx := context.Background()
	for range 10 {
		_ = b.Wait(ctx)
	}
	done := bucketWaitAsync(ctx, b)
	// Due in 6 s, plus half of the maximal jitter (half an interval: 3 s).
	if d := clk.nextTimer(t); d != 7500*time.Millisecond {
		t.Fatalf("sleep %v, want 7.5s", d)
	}
	clk.Advance(7500 * time.Millisecond)
	if err := receiveWait(t, done); err != nil {
		t.Fatal(err)
	}
	// The next token is due 6 s after the previous one was (at 12 s), not
	// 6 s after the jittered wake-up: 4.5 s from now, plus 1.5 s jitter.
	done = bucketWaitAsync(ctx, b)
	if d := clk.nextTimer(t); d != 6*time.Second {
		t.Fatalf("sleep %v, want 6s", d)
	}
	clk.Advance(6 * time.Second)
	if err := receiveWait(t, done); err != nil {
		t.Fatal(err)
	}
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
	b := newTokenBucket(10, time.Minute, clk, fixedRandom(0))
	for range 10 {
		_ = b.Wait(context.Background())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := bucketWaitAsync(ctx, b)
	clk.nextTimer(t)
	cancel()
	if err := receiveWait(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	// The canceled reservation is returned: the next caller waits 6 s, not 12 s.
	done = bucketWaitAsync(context.Background(), b)
	if d := clk.nextTimer(t); d != 6*time.Second {
		t.Fatalf("sleep %v after a canceled wait, want 6s", d)
	}
	clk.Advance(6 * time.Second)
	if err := receiveWait(t, done); err != nil {
		t.Fatal(err)
	}
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
