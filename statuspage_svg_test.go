package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   []float64
	}{
		{0, 7, []float64{0, 2, 4, 6, 8}},
		{4.1, 4.45, []float64{4.1, 4.2, 4.3, 4.4, 4.5}},
		{0, 1000000123, []float64{0, 5e8, 1e9, 1.5e9}},
		{3, 3, []float64{2, 2.5, 3, 3.5, 4}}, // one value: padded around it
		{0, 0, []float64{0, 0.5, 1}},
	} {
		if got := niceTicks(tc.lo, tc.hi, 5); !slices.Equal(got, tc.want) {
			t.Errorf("niceTicks(%v, %v) = %v, want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
}

func TestNumberLabels(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1000000123: "1,000,000,123", -1234: "-1,234"} {
		if got := groupDigits(n); got != want {
			t.Errorf("groupDigits(%d) = %q, want %q", n, got, want)
		}
	}
	for v, want := range map[float64]string{950: "950", 4.5: "4.5", 12000: "12k", 3500000: "3.5M", 2e9: "2B", 0.25: "0.25"} {
		if got := compactNumber(v); got != want {
			t.Errorf("compactNumber(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestTimeTicks(t *testing.T) {
	to := time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)
	ticks := timeTicks(to.Add(-90*24*time.Hour), to, 7)
	if len(ticks) < 3 || len(ticks) > 7 {
		t.Fatalf("%d ticks over 90 days", len(ticks))
	}
	for i, tk := range ticks {
		if tk.Hour() != 0 || tk.Minute() != 0 {
			t.Errorf("tick %v is not at midnight UTC", tk)
		}
		if i > 0 && tk.Sub(ticks[i-1]) != 14*24*time.Hour {
			t.Errorf("ticks %v and %v are not 14 days apart", ticks[i-1], tk)
		}
	}
	if got := timeTicks(to.Add(-3*24*time.Hour), to, 7); len(got) != 3 {
		t.Errorf("3 days: %d ticks, want 3 (one a day)", len(got))
	}
}

func TestTimeSeriesChartGeometry(t *testing.T) {
	to := time.Date(2026, 5, 10, 0, 0, 0, 0, time.UTC)
	from := to.Add(-10 * 24 * time.Hour)
	vals := []timeValue{{from, 2}, {from.Add(5 * 24 * time.Hour), 3}, {to, 4}}
	c := timeSeriesChart(newChart("x", "t", "u"), from, to, []namedSeries{{Class: "s", Values: vals}}, 1, 5, func(v float64) string { return "" })
	if c.Empty != "" || c.Points != 3 || len(c.Lines) != 1 || len(c.Lines[0].Points) != 3 {
		t.Fatalf("chart %+v", c)
	}
	p := c.Lines[0].Points
	// First point on the left edge, last on the right, middle halfway; the
	// highest value highest (smallest y).
	if p[0].X != c.Plot.X || p[2].X != c.Plot.Right() || math.Abs(p[1].X-(c.Plot.X+c.Plot.W/2)) > 0.01 {
		t.Errorf("x positions %v %v %v in plot %+v", p[0].X, p[1].X, p[2].X, c.Plot)
	}
	if !(p[0].Y > p[1].Y && p[1].Y > p[2].Y) || p[0].Y > c.Plot.Bottom() || p[2].Y < c.Plot.Y {
		t.Errorf("y positions %v %v %v in plot %+v", p[0].Y, p[1].Y, p[2].Y, c.Plot)
	}
	if !strings.HasPrefix(c.Lines[0].Path, "M64.0 ") || strings.Count(c.Lines[0].Path, "L") != 2 {
		t.Errorf("path %q", c.Lines[0].Path)
	}
	if len(c.YTicks) == 0 || c.YTicks[0].Label != "2" || len(c.XTicks) == 0 {
		t.Errorf("ticks y %v x %v", c.YTicks, c.XTicks)
	}
	// A pinned axis stays within 1..5 stars and ends at 5.
	one := timeSeriesChart(newChart("x", "t", "u"), from, to, []namedSeries{{Values: []timeValue{{to, 4.32}}}}, 1, 5, func(float64) string { return "" })
	var labels []string
	for _, tk := range one.YTicks {
		labels = append(labels, tk.Label)
	}
	if want := []string{"3", "3.5", "4", "4.5", "5"}; !slices.Equal(labels, want) {
		t.Errorf("rating ticks %v, want %v", labels, want)
	}
	if e := timeSeriesChart(newChart("x", "t", "u"), from, to, nil, 1, 5, nil); e.Empty == "" {
		t.Error("a chart without values is not empty")
	}
}

func TestStackedBarChart(t *testing.T) {
	to := time.Date(2026, 5, 10, 12, 0, 0, 0, time.UTC)
	from := to.Add(-2 * 24 * time.Hour)
	cats := []legendEntry{{"a", "A"}, {"b", "B"}}
	c := stackedBarChart(newChart("r", "t", "u"), from, to, cats, []stackedDays{
		{time.Date(2026, 5, 8, 0, 0, 0, 0, time.UTC), []int64{3, 1}},
		{time.Date(2026, 5, 10, 0, 0, 0, 0, time.UTC), []int64{0, 4}},
	})
	if len(c.Bars) != 3 || c.Points != 3 {
		t.Fatalf("%d bars: %+v", len(c.Bars), c.Bars)
	}
	// The day's segments stack: the second starts where the first ends, and
	// the tallest day (4) reaches the top tick.
	if math.Abs(c.Bars[1].Y+c.Bars[1].H-c.Bars[0].Y) > 0.01 {
		t.Errorf("segments do not stack: %+v %+v", c.Bars[0], c.Bars[1])
	}
	if c.Bars[2].X <= c.Bars[0].X || c.Bars[2].X+c.Bars[2].W > c.Plot.Right() {
		t.Errorf("the later day is not to the right within the plot: %+v", c.Bars)
	}
	if got := stackedBarChart(newChart("r", "t", "u"), from, to, cats, nil); got.Empty == "" {
		t.Error("no days: not empty")
	}
}

func TestHistogramAndSparkline(t *testing.T) {
	c := histogramChart(newChart("h", "t", "u"), []string{"1", "2", "3", "4", "5"}, []int64{10, 0, 5, 20, 40}, []string{"a", "b", "c", "d", "e"})
	if len(c.Bars) != 5 || c.YTicks[0].Label != "5" || c.Bars[0].W <= c.Bars[3].W || c.Bars[0].Value != "40" {
		t.Fatalf("histogram: 5★ must be the top, longest bar: %+v", c.Bars)
	}
	if e := histogramChart(newChart("h", "t", "u"), []string{"1"}, []int64{0}, []string{"a"}); e.Empty == "" {
		t.Error("an all-zero histogram is not empty")
	}
	to := time.Date(2026, 5, 10, 0, 0, 0, 0, time.UTC)
	s := newSparkline([]timeValue{{to.Add(-24 * time.Hour), 4.3}, {to, 4.3}}, to.Add(-30*24*time.Hour), to)
	if s.Empty || s.Points != 2 || s.Lo != "4.25" || s.Hi != "4.35" || s.LastX != sparkX1 {
		t.Errorf("flat sparkline: %+v", s)
	}
	if !newSparkline(nil, to, to).Empty {
		t.Error("no values: not empty")
	}
}
