package main

import (
	"context"
	"time"
)

// clock is the time source of everything that waits: the rate limiter, the
// proxy pool, the Play Store client's and the storage consumer's retries.
// Tests inject a fake one (fakeclock_test.go) to observe waits without
// sleeping.
type clock interface {
	Now() time.Time
	// NewTimer returns a channel that receives once d has passed, and a
	// function that stops the timer.
	NewTimer(d time.Duration) (<-chan time.Time, func() bool)
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// sleepOn waits d on clk, or until ctx ends; it never starts a timer for a
// non-positive d.
func sleepOn(ctx context.Context, clk clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	c, stop := clk.NewTimer(d)
	defer stop()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// everyTick calls fn with the tick's time every d until ctx ends, the
// first time d from now.
func everyTick(ctx context.Context, d time.Duration, fn func(now time.Time)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			fn(now)
		}
	}
}
