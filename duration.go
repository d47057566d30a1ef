package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strings"
	"time"
)

// The one duration syntax of playwatch, for every setting, flag and API
// parameter that takes a duration: what time.ParseDuration accepts (90s,
// 1h30m, 1.5h, 250ms), plus days, d = 24h (7d, 1d12h, 0.5d). A day is always
// 24 hours: these are spans of time, not calendar days.

// errNotDuration is the reason a value is not a duration; callers name the
// flag or variable it came from.
var errNotDuration = errors.New("not a duration such as 90s, 15m, 12h, 7d or 1d12h")

// parseDuration reads a duration in the syntax above.
func parseDuration(s string) (time.Duration, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	// Only a value with a day unit gets here: split it into its
	// number-and-unit parts and let time.ParseDuration read each, a day as
	// 24 of its hours.
	rest, neg := s, false
	if rest != "" && (rest[0] == '-' || rest[0] == '+') {
		neg, rest = rest[0] == '-', rest[1:]
	}
	if rest == "" {
		return 0, errNotDuration
	}
	var total time.Duration
	sawDay := false
	for rest != "" {
		i := strings.IndexFunc(rest, func(r rune) bool { return r != '.' && (r < '0' || r > '9') })
		if i <= 0 {
			return 0, errNotDuration
		}
		j := strings.IndexFunc(rest[i:], func(r rune) bool { return r == '.' || ('0' <= r && r <= '9') })
		if j < 0 {
			j = len(rest) - i
		}
		num, unit := rest[:i], rest[i:i+j]
		rest = rest[i+j:]
		mult := time.Duration(1)
		if unit == "d" {
			unit, mult, sawDay = "h", 24, true
		}
		d, err := time.ParseDuration(num + unit)
		if err != nil {
			return 0, errNotDuration
		}
		if d > math.MaxInt64/mult || total > math.MaxInt64-d*mult {
			return 0, errors.New("too long: at most 106751d")
		}
		total += d * mult
	}
	if !sawDay {
		return 0, errNotDuration // time.ParseDuration refused it for a reason
	}
	if neg {
		total = -total
	}
	return total, nil
}

// durationValue is a flag.Value in the syntax of parseDuration; the flag
// package names the flag in its error.
type durationValue struct{ d *time.Duration }

func (v durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

func (v durationValue) Set(s string) error {
	d, err := parseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

// durationVar is flag.DurationVar with days.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(durationValue{p}, name, usage)
}

// timeFlag reads a flag that is a time: a positive duration before now, or
// an RFC 3339 time.
func timeFlag(name, v string, now time.Time) (time.Time, error) {
	if d, err := parseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	return time.Time{}, usageError{fmt.Sprintf("%s %q: neither a duration before now (24h, 7d) nor an RFC 3339 time", name, v)}
}

// formatDuration writes d as parseDuration reads it, without zero units
// (24h, not 24h0m0s).
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
