package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// tokenBucket is a goroutine-safe token bucket: it holds up to `requests`
// tokens and refills them evenly over `period`. A caller that finds it empty
// reserves the next token and sleeps until it is due, plus a random extra of
// up to half a refill interval: the extra is not charged to the next caller,
// so the average rate stays exact while the spacing never becomes regular.
type tokenBucket struct {
	clock  clock
	random func() float64 // in [0, 1)
	rate   float64        // tokens per second; 0 means unlimited
	burst  float64
	jitter time.Duration

	mu     sync.Mutex
	tokens float64 // negative: reserved by waiters
	last   time.Time
}

// newTokenBucket allows requests per period; requests <= 0 means unlimited.
// random may be nil (math/rand/v2).
func newTokenBucket(requests int, period time.Duration, clk clock, random func() float64) *tokenBucket {
	if random == nil {
		random = rand.Float64
	}
	b := &tokenBucket{clock: clk, random: random}
	if requests > 0 && period > 0 {
		b.rate = float64(requests) / period.Seconds()
		b.burst = float64(requests)
		b.tokens = b.burst
		b.jitter = period / time.Duration(requests) / 2
		b.last = clk.Now()
	}
	return b
}

// Wait takes one token, sleeping until one is due. It returns ctx's error if
// ctx ends first, and fails at once when the token would come after ctx's
// deadline; either way the token is given back.
func (b *tokenBucket) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if b.rate == 0 {
		return nil
	}
	delay := b.reserve()
	if delay <= 0 {
		return nil
	}
	if deadline, ok := ctx.Deadline(); ok && b.clock.Now().Add(delay).After(deadline) {
		b.unreserve()
		return fmt.Errorf("rate limit: next token in %v comes after the deadline: %w", delay.Round(time.Millisecond), context.DeadlineExceeded)
	}
	if err := sleepOn(ctx, b.clock, delay); err != nil {
		b.unreserve()
		return err
	}
	return nil
}

// reserve takes a token, possibly on credit, and says how long to wait for it.
func (b *tokenBucket) reserve() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(b.burst, b.tokens+elapsed.Seconds()*b.rate)
		b.last = now
	}
	b.tokens--
	if b.tokens >= 0 {
		return 0
	}
	due := time.Duration(-b.tokens / b.rate * float64(time.Second))
	return due + time.Duration(b.random()*float64(b.jitter))
}

func (b *tokenBucket) unreserve() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+1)
}
