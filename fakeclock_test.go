package main

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock for tests. In manual mode timers fire only when the
// test calls Advance; with autoAdvance every timer fires at once and moves
// the clock forward by its duration, so code that backs off against a real
// local server runs at full speed while the waits stay observable.
type fakeClock struct {
	autoAdvance bool
	// onTimer, when set, runs as each timer is created, before it fires:
	// a test's chance to change the world during a wait.
	onTimer func(d time.Duration)

	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	waits   []time.Duration    // every timer asked for, in order
	created chan time.Duration // timers created and not yet read by nextTimer; the first 1000 kept
}

type fakeTimer struct {
	at   time.Time
	c    chan time.Time
	done bool
}

// onEveryWait is a clock whose timers fire at once, calling fn first.
func onEveryWait(fn func(d time.Duration)) *fakeClock {
	c := newFakeClock(true)
	c.onTimer = fn
	return c
}

func newFakeClock(autoAdvance bool) *fakeClock {
	// Real time as the start, so that context deadlines compare sensibly.
	return &fakeClock{autoAdvance: autoAdvance, now: time.Now(), created: make(chan time.Duration, 1000)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	if c.onTimer != nil {
		c.onTimer(d)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), c: make(chan time.Time, 1)}
	c.waits = append(c.waits, d)
	if c.autoAdvance {
		c.now = c.now.Add(d)
		t.done = true
		t.c <- c.now
	} else {
		c.timers = append(c.timers, t)
	}
	select { // a test that never reads the log must not block on it
	case c.created <- d:
	default:
	}
	return t.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		stopped := !t.done
		t.done = true
		return stopped
	}
}

// Advance moves the clock and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	pending := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.done:
		case !t.at.After(c.now):
			t.done = true
			t.c <- c.now
		default:
			pending = append(pending, t)
		}
	}
	c.timers = pending
}

// nextTimer waits (in real time, at most 5 s) until code under test starts a
// timer, and returns its duration.
func (c *fakeClock) nextTimer(t testing.TB) time.Duration {
	t.Helper()
	select {
	case d := <-c.created:
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("no timer was started")
		return 0
	}
}

// noTimer checks that no timer has been started since the last nextTimer.
func (c *fakeClock) noTimer(t testing.TB) {
	t.Helper()
	select {
	case d := <-c.created:
		t.Fatalf("unexpected timer of %v", d)
	default:
	}
}

func (c *fakeClock) allWaits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}
