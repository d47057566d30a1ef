package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Chart geometry of the status page (docs/design.md §Status page): pure
// functions from data to coordinates, axes and labels; the template only
// draws what they computed. All charts are inline SVG in a fixed viewBox
// that CSS scales to the width of the screen.

// chart is one drawn chart: a title, a unit, axes with ticks, and either
// lines with points or bars. Empty charts say so instead of drawing axes.
type chart struct {
	ID            string // element id, for tests and links
	Title         string
	Unit          string // what the y axis counts, shown beside the title
	Width, Height float64
	Plot          box // the area inside the axes
	XTicks        []tick
	YTicks        []tick
	Lines         []line
	Bars          []bar
	Legend        []legendEntry
	Points        int    // data points drawn, in data-points for tests
	Empty         string // non-empty: the chart has no data and says this
	Horizontal    bool   // bars run left to right: the grid follows XTicks
	Range         string // the period drawn, e.g. "17 Nov – 1 Dec 2026"
	Note          string // a remark under the title, e.g. that one sample is all there is
	Marks         []mark // vertical ticks at moments, e.g. when a version appeared
	xs            scale  // a time-series chart's x axis, for withMarks
}

// timeMark is a labelled moment to mark on a time-series chart.
type timeMark struct {
	T            time.Time
	Label, Title string
}

// mark is a drawn timeMark: a vertical tick at X with its label at LabelY.
type mark struct {
	X, LabelY    float64
	Label, Title string
}

// withMarks adds marks to a time-series chart, those within its period
// only; labels alternate between two rows so that close ones stay legible.
func withMarks(c chart, marks []timeMark) chart {
	if c.Empty != "" {
		return c
	}
	for _, m := range marks {
		v := float64(m.T.Unix())
		if v < c.xs.d0 || v > c.xs.d1 {
			continue
		}
		c.Marks = append(c.Marks, mark{X: c.xs.at(v), LabelY: c.Plot.Y + 10 + float64(len(c.Marks)%2)*12, Label: m.Label, Title: m.Title})
	}
	return c
}

type box struct{ X, Y, W, H float64 }

// Bottom and Right are the coordinates of the box's far edges.
func (b box) Bottom() float64 { return b.Y + b.H }
func (b box) Right() float64  { return b.X + b.W }

// tick is one labelled position on an axis.
type tick struct {
	Pos   float64
	Label string
}

type line struct {
	Class  string // CSS class: its colour
	Path   string // the SVG path's d
	Points []point
	// The newest value, written beside the line's end so the current number
	// needs no reading off the axis.
	Last         string
	LastX, LastY float64
	LastAnchor   string // text-anchor: end when the line ends at the right edge
}

type point struct {
	X, Y  float64
	Label string // the tooltip: value and time
}

type bar struct {
	X, Y, W, H float64
	Class      string
	Label      string // the tooltip
	Value      string // written beside a horizontal bar
}

type legendEntry struct{ Class, Label string }

// timeValue is one sample of a time series.
type timeValue struct {
	T time.Time
	V float64
}

// chart sizes in viewBox units; the margins leave room for tick labels.
const (
	chartWidth   = 640
	chartHeight  = 220
	marginLeft   = 64
	marginRight  = 16
	marginTop    = 12
	marginBottom = 28
	// maxMarkers is the most points drawn as circles; longer series are a
	// line alone, or the markers would hide it.
	maxMarkers = 120
)

func newChart(id, title, unit string) chart {
	return chart{ID: id, Title: title, Unit: unit, Width: chartWidth, Height: chartHeight,
		Plot: box{marginLeft, marginTop, chartWidth - marginLeft - marginRight, chartHeight - marginTop - marginBottom}}
}

// scale maps the domain [d0, d1] linearly onto [r0, r1]; a domain of one
// value maps to the middle of the range.
type scale struct{ d0, d1, r0, r1 float64 }

func (s scale) at(v float64) float64 {
	if s.d1 == s.d0 {
		return (s.r0 + s.r1) / 2
	}
	return s.r0 + (v-s.d0)/(s.d1-s.d0)*(s.r1-s.r0)
}

// niceTicks returns about n round tick values (1, 2 or 5 times a power of
// ten apart) covering [lo, hi]; the first is ≤ lo and the last ≥ hi.
func niceTicks(lo, hi float64, n int) []float64 {
	if n < 2 {
		n = 2
	}
	if hi < lo {
		lo, hi = hi, lo
	}
	if hi == lo {
		pad := math.Max(math.Abs(lo)*0.1, 1)
		if lo >= 0 && lo-pad < 0 {
			lo, hi = 0, lo+pad
		} else {
			lo, hi = lo-pad, hi+pad
		}
	}
	step := niceStep((hi - lo) / float64(n-1))
	// The epsilon keeps 4.1/0.1 = 40.99999… from starting the axis at 4.0.
	first := math.Floor(lo/step+1e-9) * step
	last := math.Ceil(hi/step-1e-9) * step
	var ts []float64
	for v := first; v <= last+step/2; v += step {
		ts = append(ts, roundTo(v, step))
	}
	return ts
}

func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / p; {
	case f <= 1:
		return p
	case f <= 2:
		return 2 * p
	case f <= 5:
		return 5 * p
	default:
		return 10 * p
	}
}

// roundTo removes the float noise that repeated additions of step leave.
func roundTo(v, step float64) float64 {
	digits := max(0, -int(math.Floor(math.Log10(step)))+1)
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'f', digits, 64), 64)
	return r
}

// compactNumber is a short tick label: 950, 1.2k, 3.5M, 2B.
func compactNumber(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e9:
		return trimZeros(v/1e9) + "B"
	case a >= 1e6:
		return trimZeros(v/1e6) + "M"
	case a >= 1e4:
		return trimZeros(v/1e3) + "k"
	default:
		return trimZeros(v)
	}
}

func trimZeros(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

// groupDigits writes an exact count with thousands separators: 91,130,079.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// timeTicks are day-aligned (UTC) ticks across [from, to], at most n of
// them, 1, 2, 7, 14 or 30 days apart.
func timeTicks(from, to time.Time, n int) []time.Time {
	day := 24 * time.Hour
	span := to.Sub(from)
	var step time.Duration
	for _, d := range []int{1, 2, 7, 14, 30} {
		step = time.Duration(d) * day
		if span/step <= time.Duration(n) {
			break
		}
	}
	var ts []time.Time
	for t := from.UTC().Truncate(day); !t.After(to); t = t.Add(step) {
		if !t.Before(from) {
			ts = append(ts, t)
		}
	}
	return ts
}

// minWindow is the shortest period a chart spans: a few days of data are
// drawn across a fortnight, not squeezed against the right edge of 90 days.
const minWindow = 14 * 24 * time.Hour

// fitWindow narrows [from, to] to start a day before first (the oldest
// data), but spans at least minWindow.
func fitWindow(from, to, first time.Time) time.Time {
	start := first.Add(-24 * time.Hour)
	if to.Sub(start) < minWindow {
		start = to.Add(-minWindow)
	}
	if start.Before(from) {
		return from
	}
	return start
}

func periodLabel(from, to time.Time) string {
	return from.UTC().Format("2 Jan") + " – " + to.UTC().Format("2 Jan 2006")
}

// timeSeriesChart draws series over [from, to] (UTC days on the x axis)
// with a y axis of round ticks; yFloor and yCeil, when not NaN, pin the
// axis (ratings run 1 to 5). format labels a value in a tooltip.
func timeSeriesChart(c chart, from, to time.Time, series []namedSeries, yFloor, yCeil float64, format func(float64) string) chart {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for _, p := range s.Values {
			lo, hi = math.Min(lo, p.V), math.Max(hi, p.V)
		}
	}
	if math.IsInf(lo, 1) {
		c.Empty = "no data in this period"
		return c
	}
	first, samples := to, 0
	for _, s := range series {
		for _, p := range s.Values {
			if p.T.Before(first) {
				first = p.T
			}
		}
		samples = max(samples, len(s.Values))
	}
	from = fitWindow(from, to, first)
	c.Range = periodLabel(from, to)
	if samples == 1 {
		c.Note = "one sample stored so far: the line starts with the next"
	}
	yt := niceTicks(lo, hi, 5)
	if !math.IsNaN(yFloor) && yt[0] < yFloor {
		yt = niceTicks(math.Max(lo, yFloor), hi, 5)
		if yt[0] < yFloor {
			yt[0] = yFloor
		}
	}
	if !math.IsNaN(yCeil) && yt[len(yt)-1] > yCeil {
		yt = slices.DeleteFunc(yt, func(v float64) bool { return v > yCeil })
		if len(yt) == 0 || yt[len(yt)-1] < yCeil {
			yt = append(yt, yCeil)
		}
	}
	ys := scale{yt[0], yt[len(yt)-1], c.Plot.Bottom(), c.Plot.Y}
	xs := scale{float64(from.Unix()), float64(to.Unix()), c.Plot.X, c.Plot.Right()}
	c.xs = xs
	for _, v := range yt {
		c.YTicks = append(c.YTicks, tick{ys.at(v), compactNumber(v)})
	}
	c.XTicks = dayTicks(xs, from, to)
	for _, s := range series {
		l := line{Class: s.Class}
		var d strings.Builder
		for i, p := range s.Values {
			x, y := xs.at(float64(p.T.Unix())), ys.at(p.V)
			cmd := "L"
			if i == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f", cmd, x, y)
			if len(s.Values) <= maxMarkers {
				l.Points = append(l.Points, point{x, y, format(p.V) + " · " + p.T.UTC().Format("2 Jan 2006 15:04 UTC")})
			}
		}
		l.Path = d.String()
		if n := len(s.Values); n > 0 {
			last := s.Values[n-1]
			l.Last, l.LastX, l.LastY, l.LastAnchor = format(last.V), xs.at(float64(last.T.Unix()))-6, ys.at(last.V)-8, "end"
		}
		c.Points += len(s.Values)
		c.Lines = append(c.Lines, l)
		if s.Name != "" {
			c.Legend = append(c.Legend, legendEntry{s.Class, s.Name})
		}
	}
	return c
}

// namedSeries is one line of a time-series chart.
type namedSeries struct {
	Name, Class string
	Values      []timeValue
}

func dayTicks(xs scale, from, to time.Time) []tick {
	var ts []tick
	for _, t := range timeTicks(from, to, 7) {
		ts = append(ts, tick{xs.at(float64(t.Unix())), t.Format("2 Jan")})
	}
	return ts
}

// stackedDays is a count per UTC day and category, for a stacked bar chart.
type stackedDays struct {
	Day    time.Time
	Counts []int64 // in the order of the chart's categories
}

// stackedBarChart draws one bar per day of [from, to), each stacked from
// its categories' counts in order, with a count axis.
func stackedBarChart(c chart, from, to time.Time, categories []legendEntry, days []stackedDays) chart {
	var top int64
	for _, d := range days {
		var sum int64
		for _, n := range d.Counts {
			sum += n
		}
		top = max(top, sum)
	}
	if top == 0 {
		c.Empty = "no reviews in this period"
		return c
	}
	c.Legend = categories
	first := to
	for _, d := range days {
		if d.Day.Before(first) {
			first = d.Day
		}
	}
	from = fitWindow(from, to, first)
	c.Range = periodLabel(from, to)
	yt := niceTicks(0, float64(top), 5)
	ys := scale{0, yt[len(yt)-1], c.Plot.Bottom(), c.Plot.Y}
	for _, v := range yt {
		c.YTicks = append(c.YTicks, tick{ys.at(v), compactNumber(v)})
	}
	day := 24 * time.Hour
	from = from.UTC().Truncate(day)
	ndays := max(1, int(to.Sub(from)/day)+1)
	slot := c.Plot.W / float64(ndays)
	xs := scale{float64(from.Unix()), float64(from.Add(time.Duration(ndays) * day).Unix()), c.Plot.X, c.Plot.Right()}
	c.XTicks = dayTicks(xs, from, to)
	for i := range c.XTicks {
		c.XTicks[i].Pos += slot / 2 // under the middle of the day's bar
	}
	for _, d := range days {
		x := xs.at(float64(d.Day.UTC().Truncate(day).Unix())) + slot*0.1
		var base float64
		for i, n := range d.Counts {
			if n == 0 {
				continue
			}
			y0, y1 := ys.at(base), ys.at(base+float64(n))
			c.Bars = append(c.Bars, bar{x, y1, slot * 0.8, y0 - y1, categories[i].Class,
				fmt.Sprintf("%s: %s %s", d.Day.UTC().Format("2 Jan 2006"), groupDigits(n), categories[i].Label), ""})
			base += float64(n)
			c.Points++
		}
	}
	return c
}

// histogramChart draws horizontal bars, one per label (5★ at the top), with
// a count axis along the bottom.
func histogramChart(c chart, labels []string, counts []int64, classes []string) chart {
	var top int64
	for _, n := range counts {
		top = max(top, n)
	}
	if top == 0 {
		c.Empty = "the store showed no rating histogram"
		return c
	}
	c.Horizontal = true
	c.Plot.X = 48
	c.Plot.W = c.Width - c.Plot.X - marginRight - 64 // room for the count after the bar
	xt := niceTicks(0, float64(top), 5)
	xs := scale{0, xt[len(xt)-1], c.Plot.X, c.Plot.Right()}
	for _, v := range xt {
		c.XTicks = append(c.XTicks, tick{xs.at(v), compactNumber(v)})
	}
	slot := c.Plot.H / float64(len(labels))
	for i := range labels {
		j := len(labels) - 1 - i // the last label on top
		y := c.Plot.Y + float64(i)*slot
		c.YTicks = append(c.YTicks, tick{y + slot/2, labels[j]})
		c.Bars = append(c.Bars, bar{c.Plot.X, y + slot*0.15, xs.at(float64(counts[j])) - c.Plot.X, slot * 0.7, classes[j],
			labels[j] + ": " + groupDigits(counts[j]) + " ratings", groupDigits(counts[j])})
		c.Points++
	}
	return c
}

// sparkline is the small 30-day rating line of the overview: a polyline in
// a w×h box plus the lowest and highest value for its axis labels.
type sparkline struct {
	Path         string
	Points       int
	Lo, Hi       string // the y range, labelled
	First, Last  string // the x range, labelled
	LastX, LastY float64
	Empty        bool
}

// The sparkline's box: room on the left for its y labels, the line in
// [sparkX0, sparkX1] × [sparkY0, sparkY1].
const (
	sparkWidth  = 170
	sparkHeight = 36
	sparkX0     = 38
	sparkX1     = 166
	sparkY0     = 4
	sparkY1     = 32
)

func newSparkline(values []timeValue, from, to time.Time) sparkline {
	if len(values) == 0 {
		return sparkline{Empty: true}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range values {
		lo, hi = math.Min(lo, p.V), math.Max(hi, p.V)
	}
	// A rating that barely moves still shows its wiggle, but never as if it
	// had fallen by stars: the y range is at least 0.1.
	if hi-lo < 0.1 {
		mid := (hi + lo) / 2
		lo, hi = mid-0.05, mid+0.05
	}
	xs := scale{float64(from.Unix()), float64(to.Unix()), sparkX0, sparkX1}
	ys := scale{lo, hi, sparkY1, sparkY0}
	var d strings.Builder
	s := sparkline{Points: len(values), Lo: fmt.Sprintf("%.2f", lo), Hi: fmt.Sprintf("%.2f", hi),
		First: from.UTC().Format("2 Jan"), Last: to.UTC().Format("2 Jan")}
	for i, p := range values {
		cmd := "L"
		if i == 0 {
			cmd = "M"
		}
		s.LastX, s.LastY = xs.at(float64(p.T.Unix())), ys.at(p.V)
		fmt.Fprintf(&d, "%s%.1f %.1f", cmd, s.LastX, s.LastY)
	}
	s.Path = d.String()
	return s
}
