package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The status page (docs/design.md §Status page): `/` shows every active app
// and the health of the system, `/apps/{package}` one app's history. Server
// rendered, inline SVG, no script: it works on a server without internet,
// and its Content-Security-Policy lets the browser load nothing else.

//go:embed web/status.html.tmpl
var statusTemplateText string

//go:embed web/style.css
var statusCSS string

// statusCSP allows the one inline stylesheet (by its hash) and nothing else:
// no script, no image, font or connection to anywhere.
var statusCSP = func() string {
	sum := sha256.Sum256([]byte(statusCSS))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) +
		"'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}()

var statusTemplates = template.Must(template.New("status").Funcs(template.FuncMap{
	"css":  func() template.CSS { return template.CSS(statusCSS) },
	"add":  func(a, b float64) float64 { return a + b },
	"sub":  func(a, b float64) float64 { return a - b },
	"half": func(a float64) float64 { return a / 2 },
}).Parse(statusTemplateText))

// statusPage serves the page. health is the process's own metrics registry:
// the crawler's, proxies' and consumer's state where those roles run here.
// gauges holds the per-app gauges apart from it, so that reading the health
// does not run their query; /metrics serves both.
type statusPage struct {
	db        statusDB
	health    prometheus.Gatherer
	gauges    *prometheus.Registry
	appGauges *appGaugeCollector // in gauges; its run refreshes them
	token     string             // STATUS_PAGE_TOKEN; empty: the page is open
	interval  time.Duration      // CRAWL_INTERVAL: a path older than two is failing
	renders   chan struct{}      // a slot per page being drawn: STATUS_PAGE_MAX_RENDERS
	now       func() time.Time
	logger    *slog.Logger
	reviews   *reviewsSource // /reviews (statuspage_reviews.go); nil: not served
	// locales resolve the storefront of an app registered without any
	// (PLAYSTORE_*; statuspage_storefronts.go).
	locales localeDefaults
}

func newStatusPage(db statusDB, health prometheus.Gatherer, token string, interval, gaugesEvery time.Duration, maxRenders int, logger *slog.Logger) *statusPage {
	p := &statusPage{db: db, health: health, gauges: prometheus.NewRegistry(), token: token, interval: interval,
		renders: make(chan struct{}, maxRenders), now: time.Now, logger: logger}
	p.appGauges = newAppGaugeCollector(db, func() time.Time { return p.now() }, func() localeDefaults { return p.locales }, gaugesEvery, logger)
	p.gauges.MustRegister(p.appGauges)
	return p
}

func (p *statusPage) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", p.requireToken(p.limitRenders(p.serveOverview)))
	mux.HandleFunc("/{$}", methodNotAllowed("GET"))
	mux.HandleFunc("GET /apps/{package}", p.requireToken(p.limitRenders(p.serveApp)))
	mux.HandleFunc("/apps/{package}", methodNotAllowed("GET"))
	p.registerReviews(mux)
}

// requireToken asks for HTTP basic auth with STATUS_PAGE_TOKEN as the
// password (any user name) when it is set.
func (p *statusPage) requireToken(next http.HandlerFunc) http.HandlerFunc {
	return requireTokenGiven(func() string { return p.token }, basicToken, basicChallenge, func(w http.ResponseWriter) {
		http.Error(w, "the status page needs HTTP basic auth with STATUS_PAGE_TOKEN as the password", http.StatusUnauthorized)
	}, next)
}

// retryAfterSeconds is the Retry-After of a 503: about the time a page
// takes to draw when the database is busy.
const retryAfterSeconds = 2

// limitRenders draws at most STATUS_PAGE_MAX_RENDERS pages at once. Past
// that a request is told at once to come back (503, Retry-After) rather than
// queue: a crowd reloading the page then costs the database no more than
// that many readers.
func (p *statusPage) limitRenders(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		select {
		case p.renders <- struct{}{}:
			defer func() { <-p.renders }()
			next(w, r)
		default:
			p.unavailable(w, "Status page busy", fmt.Sprintf(
				"%d pages are being drawn, the most at once (STATUS_PAGE_MAX_RENDERS); try again in a few seconds.", cap(p.renders)))
		}
	}
}

// overviewPage is what the template draws for `/`.
type overviewPage struct {
	Title     string
	Generated string
	Health    healthView
	Apps      []overviewRow
	Interval  string
}

type overviewRow struct {
	Package, Name, Link string
	Messaging           bool
	Fronts              []frontRow // the app's storefronts side by side, the first first
}

// frontRow is one storefront of an overview row: each cell of the row
// shows it as one line, so the storefronts' lines stand side by side.
type frontRow struct {
	Label           string // "ir/fa"; empty for an app of one storefront, which looks as before storefronts
	Score           string
	Change          string
	ChangeClass     string
	ChangeTitle     string
	Ratings         string
	Installs        string
	InstallsTitle   string
	Reviews24h      []sentimentChip
	Reviews24hTotal string
	NegativeShare   string // of the labelled reviews of the last 24 h, shown with a Label; empty: none labelled
	Stats, Reviews  freshness
	Causes          []crawlCause // why the last crawl of a path did not store it
	Spark           sparkline
}

// crawlCause is a line under an app's freshness: a path's last crawl that
// failed, as a person reads it, and when (Title: the outcome and its error).
type crawlCause struct {
	Text, Title string
}

type sentimentChip struct {
	Class, Label string
	N            string
}

// freshness is a path's last stored crawl and its age.
type freshness struct {
	When, Age, Class string
}

func (p *statusPage) serveOverview(w http.ResponseWriter, r *http.Request) {
	now := p.now()
	var apps []overviewApp
	var deadLetters int64
	var cycle *lastCrawlCycle
	var notify notifyCounts
	err := p.db.read(r.Context(), func(tx pgx.Tx) (err error) {
		if apps, err = loadOverview(r.Context(), tx, now, p.locales); err != nil {
			return err
		}
		if notify, err = loadNotifyCounts(r.Context(), tx, now); err != nil {
			return err
		}
		if cycle, err = loadLastCrawlCycle(r.Context(), tx); err != nil {
			return err
		}
		deadLetters, err = countDeadLetters(r.Context(), tx, now.Add(-24*time.Hour))
		return err
	})
	if err != nil {
		p.fail(w, r, err)
		return
	}
	page := overviewPage{Title: "playwatch status", Generated: now.UTC().Format("2 Jan 2006 15:04:05 UTC"),
		Interval: p.interval.String()}
	page.Health = p.healthOf(apps, cycle, deadLetters, now)
	page.Health.Cards = append(page.Health.Cards, notifyCard(notify, r.Host))
	for _, a := range apps {
		page.Apps = append(page.Apps, p.overviewRowOf(a, now))
	}
	p.render(w, r, "overview", page)
}

func (p *statusPage) overviewRowOf(a overviewApp, now time.Time) overviewRow {
	row := overviewRow{Package: a.Package, Name: a.Name, Link: "/apps/" + a.Package, Messaging: a.Messaging}
	for _, f := range a.Storefronts {
		fr := p.frontRowOf(f, now)
		if len(a.Storefronts) > 1 {
			fr.Label = storefrontLabel(f.Front)
		}
		row.Fronts = append(row.Fronts, fr)
	}
	return row
}

func (p *statusPage) frontRowOf(a overviewStorefront, now time.Time) frontRow {
	row := frontRow{Score: "—", Change: "—", Ratings: "—", Installs: "—", ChangeTitle: "one listing stored so far: no change to show yet"}
	if a.Score != nil {
		row.Score = fmt.Sprintf("%.2f", *a.Score)
	}
	if a.Score != nil && a.BaseScore != nil && a.BaseAt != nil && a.StatsAt != nil && a.BaseAt.Before(*a.StatsAt) {
		d := *a.Score - *a.BaseScore
		row.Change = fmt.Sprintf("%+.2f", d)
		row.ChangeClass = "flat"
		switch {
		case d <= -0.005:
			row.ChangeClass = "down"
			row.Change = "▼ " + fmt.Sprintf("%.2f", -d)
		case d >= 0.005:
			row.ChangeClass = "up"
			row.Change = "▲ " + fmt.Sprintf("%.2f", d)
		}
		row.ChangeTitle = fmt.Sprintf("score %.2f on %s, %.2f now", *a.BaseScore, a.BaseAt.UTC().Format("2 Jan 15:04"), *a.Score)
		if now.Sub(*a.BaseAt) < 7*24*time.Hour-time.Hour {
			row.ChangeTitle += " (less than 7 days of data)"
		}
	}
	if a.Ratings != nil {
		row.Ratings = groupDigits(*a.Ratings)
	}
	row.Installs, row.InstallsTitle = installsOf(a.RealInstalls, a.MinInstalls)
	row.Reviews24h = sentimentChips(a.Reviews24h)
	row.Reviews24hTotal = groupDigits(a.Reviews24h.Total())
	if labelled := a.Reviews24h.Total() - a.Reviews24h.None; labelled > 0 {
		row.NegativeShare = fmt.Sprintf("%.0f %% negative", 100*float64(a.Reviews24h.Negative)/float64(labelled))
	}
	row.Stats = p.freshnessOf(a.StatsAt, now)
	row.Reviews = p.freshnessOf(a.ReviewsSyncedAt, now)
	if a.ReviewsSyncedAt == nil && a.ReviewsOutcome != nil && a.ReviewsOutcome.Outcome == "ok" {
		// Read in full without an error and nothing stored: the store
		// shows no review of the app, which is not a failure.
		row.Reviews = p.freshnessOf(&a.ReviewsOutcome.At, now)
		row.Reviews.Age = "no reviews on the store"
		if row.Reviews.Class == "bad" {
			row.Reviews.Age += ", checked " + ago(now.Sub(a.ReviewsOutcome.At))
		}
	}
	row.Causes = crawlCauses(a, now)
	row.Spark = newSparkline(a.Spark, now.Add(-30*24*time.Hour), now)
	return row
}

// sentimentCategories are the sentiment job's labels plus "not scored", in
// the order the page stacks and lists them.
var sentimentCategories = []legendEntry{
	{"neg", "negative"}, {"neu", "neutral"}, {"pos", "positive"}, {"none", "not scored"},
}

func sentimentChips(c sentimentCounts) []sentimentChip {
	var chips []sentimentChip
	for i, n := range []int64{c.Negative, c.Neutral, c.Positive, c.None} {
		if n > 0 {
			chips = append(chips, sentimentChip{sentimentCategories[i].Class, sentimentCategories[i].Label, groupDigits(n)})
		}
	}
	return chips
}

func (p *statusPage) freshnessOf(t *time.Time, now time.Time) freshness {
	if t == nil {
		return freshness{When: "never", Age: "no crawl stored", Class: "bad"}
	}
	f := freshness{When: t.UTC().Format("2 Jan 15:04 UTC"), Age: ago(now.Sub(*t)), Class: "ok"}
	if now.Sub(*t) > 2*p.interval {
		f.Class = "bad"
	}
	return f
}

// crawlCauses are the failed last crawls of a storefront's paths, one
// line for both when they failed alike.
func crawlCauses(a overviewStorefront, now time.Time) []crawlCause {
	sc, rc := outcomeCause(a.StatsOutcome), outcomeCause(a.ReviewsOutcome)
	line := func(label, cause string, o *outcomeRow) crawlCause {
		title := o.At.UTC().Format("2 Jan 15:04 UTC") + ": " + o.Outcome
		if o.Error != "" {
			title += ": " + o.Error
		}
		return crawlCause{Text: label + ": " + cause + ", " + ago(now.Sub(o.At)), Title: title}
	}
	switch {
	case sc != "" && sc == rc:
		return []crawlCause{line("listing and reviews", sc, a.StatsOutcome)}
	case sc != "" && rc != "":
		return []crawlCause{line("listing", sc, a.StatsOutcome), line("reviews", rc, a.ReviewsOutcome)}
	case sc != "":
		return []crawlCause{line("listing", sc, a.StatsOutcome)}
	case rc != "":
		return []crawlCause{line("reviews", rc, a.ReviewsOutcome)}
	}
	return nil
}

// outcomeCause is a crawl outcome (docs/schema.md, app_crawl_outcomes) as
// a short cause a person understands; empty for none and for ok.
func outcomeCause(o *outcomeRow) string {
	if o == nil {
		return ""
	}
	status := func(def int32) string {
		if o.HTTPStatus != nil {
			def = *o.HTTPStatus
		}
		if def == 0 {
			return ""
		}
		return fmt.Sprintf(" (%d)", def)
	}
	switch o.Outcome {
	case "ok":
		return ""
	case "not_found":
		return "not found on Google Play" + status(404)
	case "throttled":
		return "throttled by Google Play" + status(429)
	case "benched":
		if o.Error != "" {
			return o.Error // "egress NAME benched until 14:05 UTC"
		}
		return "every egress benched"
	case "dns":
		return "DNS lookup failed"
	case "network":
		return "network error on the way to Google Play"
	case "timeout":
		return "crawl took longer than CRAWL_APP_TIMEOUT"
	case "parse_error":
		return "page layout not understood"
	case "canceled":
		return "crawl cut short (shutdown, or its job moved to another worker)"
	case "http_error":
		return "Google Play answered an HTTP error" + status(0)
	}
	if o.Error != "" {
		return "crawl failed: " + shortText(o.Error, 120)
	}
	return "crawl failed (" + o.Outcome + ")"
}

// shortText is s cut to at most n runes, with an ellipsis when cut.
func shortText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// ago is a duration as a person says it: "just now", "12 min ago", "3 h ago", "5 days ago".
func ago(d time.Duration) string {
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%d days ago", int(d.Hours()/24))
	}
}

// healthView is the row of cards above the overview.
type healthView struct {
	Cards []healthCard
}

type healthCard struct {
	Title, Value, Detail, Class string
}

// healthOf reads the proxies' and consumer's metrics from this process's
// registry; a role that does not run here has none, and its card says so.
// The last crawl cycle and the failing apps come from the database, so that
// every instance shows them: the cycle the scheduler leader planned last,
// and the active apps whose stored listing or reviews are older than two
// crawl intervals, or missing.
func (p *statusPage) healthOf(apps []overviewApp, cycle *lastCrawlCycle, deadLetters int64, now time.Time) healthView {
	families := map[string]*dto.MetricFamily{}
	if fs, err := p.health.Gather(); err != nil {
		p.logger.Warn("status page: cannot gather this process's metrics", "err", err)
	} else {
		for _, f := range fs {
			families[f.GetName()] = f
		}
	}
	var cards []healthCard

	cards = append(cards, p.cycleCard(cycle, families["playwatch_crawl_app_paths_total"], now))

	failing := healthCard{Title: "Apps failing", Class: "ok"}
	var names []string
	for _, a := range apps {
		// An app fails when one of its storefronts does: its name with
		// those storefronts (of an app of several) and their last
		// crawl's cause, where one failed.
		var fronts []string
		for _, f := range a.Storefronts {
			reviewsKnown := f.ReviewsSyncedAt != nil
			if p.freshnessOf(f.StatsAt, now).Class != "bad" && (!reviewsKnown || p.freshnessOf(f.ReviewsSyncedAt, now).Class != "bad") {
				continue
			}
			var front string
			if len(a.Storefronts) > 1 {
				front = storefrontLabel(f.Front)
			}
			if c := cmp.Or(outcomeCause(f.StatsOutcome), outcomeCause(f.ReviewsOutcome)); c != "" {
				front = strings.TrimSpace(front + " " + c)
			}
			fronts = append(fronts, front)
		}
		if len(fronts) == 0 {
			continue
		}
		name := a.Name
		if detail := strings.Join(slices.DeleteFunc(fronts, func(s string) bool { return s == "" }), ", "); detail != "" {
			name += ": " + detail
		}
		names = append(names, name)
	}
	failing.Value = fmt.Sprintf("%d of %d", len(names), len(apps))
	failing.Detail = "no stored crawl within 2 × CRAWL_INTERVAL (" + (2 * p.interval).String() + ")"
	if len(names) > 0 {
		failing.Class = "bad"
		failing.Detail = strings.Join(shortList(names, 5), "; ") + " — " + failing.Detail
	}
	if len(apps) == 0 {
		failing.Value, failing.Class, failing.Detail = "no apps", "unknown", "register apps with POST /api/v1/apps"
	}
	cards = append(cards, failing)

	proxies := healthCard{Title: "Proxies benched", Value: "not running in this process", Class: "unknown",
		Detail: "the crawler role runs elsewhere, or not at all"}
	if f, ok := families["playwatch_proxy_benched"]; ok {
		benched, total := sumOf(f), len(f.GetMetric())
		proxies.Value = fmt.Sprintf("%d of %d", int(benched), total)
		proxies.Class, proxies.Detail = "ok", "egresses (each proxy, or direct) cooling down after 429s or timeouts"
		switch {
		case total > 0 && int(benched) == total:
			proxies.Class, proxies.Detail = "bad", "every egress is benched: the crawl waits"
		case benched > 0:
			proxies.Class = "warn"
		}
	}
	cards = append(cards, proxies)

	consumer := healthCard{Title: "Consumer lag", Value: "not running in this process", Class: "unknown",
		Detail: "the consumer role runs elsewhere, or not at all"}
	// The consumer's metrics exist from its start (paused is a plain
	// gauge); the lag's series only from its first fetch of records.
	if _, ok := families["playwatch_consumer_paused"]; ok {
		lag := sumOf(families["playwatch_consumer_lag_records"])
		consumer.Value = groupDigits(int64(lag)) + " records"
		consumer.Class, consumer.Detail = "ok", "waiting to be stored, at the last fetch"
		if _, fetched := families["playwatch_consumer_lag_records"]; !fetched {
			consumer.Detail = "no record fetched yet"
		}
		if lag > 0 {
			consumer.Class = "warn"
		}
		if sumOf(families["playwatch_consumer_paused"]) > 0 {
			consumer.Class, consumer.Detail = "bad", "paused: the database cannot take the batch"
		}
	}
	cards = append(cards, consumer)

	dl := healthCard{Title: "Dead letters, 24 h", Value: groupDigits(deadLetters), Class: "ok",
		Detail: "records that can never be stored; see playwatch dlq list"}
	if deadLetters > 0 {
		dl.Class = "bad"
	}
	cards = append(cards, dl)
	return healthView{Cards: cards}
}

// cycleCard is the newest cycle: finished (red when that is more than two
// crawl intervals ago) or running (red when it started more than two
// intervals ago: its jobs are not being crawled). Where the crawler runs
// here, this process's outcomes of the app paths follow.
func (p *statusPage) cycleCard(c *lastCrawlCycle, paths *dto.MetricFamily, now time.Time) healthCard {
	card := healthCard{Title: "Last crawl cycle", Value: "none planned yet", Class: "unknown",
		Detail: "no scheduler has planned a cycle in this database yet"}
	if c != nil {
		apps := "its jobs being published"
		if c.Apps != nil {
			apps = groupDigits(int64(*c.Apps)) + " apps"
		}
		planned := c.PlannedAt.UTC().Format("2 Jan 15:04 UTC")
		if c.FinishedAt != nil {
			card.Value, card.Class = "finished "+ago(now.Sub(*c.FinishedAt)), "ok"
			card.Detail = fmt.Sprintf("cycle %d: %s, planned %s, took %s", c.ID, apps, planned, c.FinishedAt.Sub(c.PlannedAt).Round(time.Second))
			if now.Sub(*c.FinishedAt) > 2*p.interval {
				card.Class = "bad"
			}
		} else {
			card.Value, card.Class = "running, started "+ago(now.Sub(c.PlannedAt)), "ok"
			card.Detail = fmt.Sprintf("cycle %d: %s, planned %s", c.ID, apps, planned)
			if now.Sub(c.PlannedAt) > 2*p.interval {
				card.Class = "bad"
			}
		}
	}
	if paths != nil {
		card.Detail += "; app paths crawled by this process: " + outcomeSummary(paths)
	}
	return card
}

func shortList(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("%d more", len(s)-n))
}

// sumOf adds the values of a family's series (0 for a missing family).
func sumOf(f *dto.MetricFamily) float64 {
	var sum float64
	for _, m := range f.GetMetric() {
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		}
	}
	return sum
}

// outcomeSummary is playwatch_crawl_app_paths_total as "stats ok 40, reviews
// not_found 2, …", the successes first.
func outcomeSummary(f *dto.MetricFamily) string {
	type oc struct {
		key string
		n   float64
	}
	var ocs []oc
	for _, m := range f.GetMetric() {
		var path, outcome string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "path":
				path = l.GetValue()
			case "outcome":
				outcome = l.GetValue()
			}
		}
		if v := m.GetCounter().GetValue(); v > 0 {
			ocs = append(ocs, oc{path + " " + outcome, v})
		}
	}
	if len(ocs) == 0 {
		return "none yet"
	}
	sort.Slice(ocs, func(i, j int) bool {
		iok, jok := strings.HasSuffix(ocs[i].key, " ok"), strings.HasSuffix(ocs[j].key, " ok")
		if iok != jok {
			return iok
		}
		return ocs[i].key < ocs[j].key
	})
	parts := make([]string, len(ocs))
	for i, o := range ocs {
		parts[i] = fmt.Sprintf("%s %s", o.key, groupDigits(int64(o.n)))
	}
	return strings.Join(parts, ", ")
}

// appPage is what the template draws for `/apps/{package}`.
type appPage struct {
	Title     string
	Generated string
	App       appDetail
	Front     string           // the storefront shown, "ir/fa"; empty for an app of one storefront
	Switch    []storefrontLink // the storefront switch, with two or more
	Compare   compareView      // the storefronts' newest listings side by side, with two or more
	Facts     []fact
	Charts    []chart
	Histogram chart
	Negative  []negativeView
	Topics    []topicView // the last 7 days
	Releases  releasesSection
	Network   []networkView
	RTT       chart
	ShowNet   bool
	NoListing string          // what the facts say when no listing is stored
	Outcomes  []outcomeView   // the last crawl of each path and storefront
	Links     *appReviewLinks // to the reviews page; nil when it is not served
}

type outcomeView struct {
	Path, Storefront, When, Outcome, Cause, HTTPStatus, Error string
	Class                                                     string
}

type fact struct{ Label, Value, Title string }

type negativeView struct {
	When, Stars, User, Content, Version, Why string
	Reply, RepliedAt                         string
}

type networkView struct {
	Scenario, When, File, RTT, Retrans, OutOfOrder, ZeroWin, Resets, Bytes, Overhead string
	Captures                                                                         int
}

func (p *statusPage) serveApp(w http.ResponseWriter, r *http.Request) {
	pkg := r.PathValue("package")
	if err := validatePackageName(pkg); err != nil {
		p.notFound(w, r, pkg)
		return
	}
	now := p.now()
	var d appDetail
	front, given := r.URL.Query()["storefront"]
	param := ""
	if given {
		param = front[0]
	}
	err := p.db.read(r.Context(), func(tx pgx.Tx) (err error) {
		d, err = loadAppDetail(r.Context(), tx, pkg, now, p.locales, param, given)
		return
	})
	if errors.Is(err, errStatusAppNotFound) {
		p.notFound(w, r, pkg)
		return
	}
	if se := (*storefrontError)(nil); errors.As(err, &se) {
		var buf bytes.Buffer
		_ = statusTemplates.ExecuteTemplate(&buf, "message", messagePage{Title: "No such storefront · playwatch status", Message: se.Message,
			Link: "/apps/" + d.Package, LinkText: "← " + d.Name + " in its first storefront"})
		writeHTML(w, statusCSP, se.Code, buf.Bytes())
		return
	}
	if err != nil {
		p.fail(w, r, err)
		return
	}
	page := p.appPageOf(d, now)
	if p.reviews != nil {
		var version *string
		if d.Latest != nil {
			version = d.Latest.Version
		}
		links := appReviewLinksOf(d.Package, version)
		if len(d.Storefronts) > 1 {
			// The storefront's reviews (the reviews page's country and lang filters).
			sf := "&country=" + url.QueryEscape(d.Front.Country) + "&lang=" + url.QueryEscape(d.Front.Lang)
			links.All, links.Negative = links.All+sf, links.Negative+sf
			if links.Version != "" {
				links.Version += sf
			}
		}
		page.Links = &links
	}
	p.render(w, r, "app", page)
}

func (p *statusPage) appPageOf(d appDetail, now time.Time) appPage {
	page := appPage{Title: d.Name + " · playwatch status", Generated: now.UTC().Format("2 Jan 2006 15:04:05 UTC"), App: d,
		NoListing: "No data: no listing of this app is stored yet."}
	if len(d.Storefronts) > 1 {
		page.Front = storefrontLabel(d.Front)
		page.Title = d.Name + " (" + page.Front + ") · playwatch status"
		page.NoListing = "No data: no listing of this app in " + page.Front + " is stored yet."
		page.Switch = storefrontSwitch(d.Package, d.Storefronts, d.Front)
		page.Compare = compareViewOf(d.Package, d.Compare, d.Front, now)
	}
	listingCause := false // the first failed listing crawl, where none is stored, says why
	for _, o := range d.Outcomes {
		v := outcomeView{Path: o.Path, Storefront: o.Country + "/" + o.Lang, When: o.At.UTC().Format("2 Jan 2006 15:04 UTC") + " (" + ago(now.Sub(o.At)) + ")",
			Outcome: o.Outcome, Cause: outcomeCause(&o), HTTPStatus: "—", Error: o.Error, Class: "ok"}
		if v.Path == "stats" {
			v.Path = "listing"
		}
		if o.HTTPStatus != nil {
			v.HTTPStatus = strconv.Itoa(int(*o.HTTPStatus))
		}
		if v.Cause != "" {
			v.Class = "bad"
			if o.Path == "stats" && d.Latest == nil && !listingCause {
				listingCause = true
				page.NoListing = "No listing stored yet: " + v.Cause + " (last crawl " + ago(now.Sub(o.At)) + ")."
			}
		}
		page.Outcomes = append(page.Outcomes, v)
	}
	if l := d.Latest; l != nil {
		installsFact := fact{Label: "Installs"}
		installsFact.Value, installsFact.Title = installsOf(l.RealInstalls, l.MinInstalls)
		page.Facts = append(page.Facts, fact{"Score", optFloat(l.Score, "%.2f"), "average rating of the newest listing"},
			fact{"Ratings", optInt(l.Ratings), ""}, installsFact, fact{"Version", optString(l.Version), ""},
			fact{"Listing crawled", l.At.UTC().Format("2 Jan 2006 15:04 UTC") + " (" + ago(now.Sub(l.At)) + ")", ""})
		if l.Developer != nil {
			page.Facts = append(page.Facts, fact{"Developer", *l.Developer, ""})
		}
	}
	from := now.Add(-90 * 24 * time.Hour)
	var rating, installs []timeValue
	ratingFloor := 1.0 // a score of 0 (no ratings yet) lowers the axis to 0
	for _, s := range d.Stats {
		if s.Score != nil {
			rating = append(rating, timeValue{s.At, *s.Score})
			if *s.Score < 1 {
				ratingFloor = 0
			}
		}
		if n := firstNonNil(s.RealInstalls, s.MinInstalls); n != nil {
			installs = append(installs, timeValue{s.At, float64(*n)})
		}
	}
	page.Charts = append(page.Charts,
		withMarks(timeSeriesChart(newChart("rating", "Rating", fmt.Sprintf("stars, %g–5", ratingFloor)), from, now,
			[]namedSeries{{Class: "s-rating", Values: rating}}, ratingFloor, 5, func(v float64) string { return fmt.Sprintf("%.2f stars", v) }),
			releaseMarks(d.Releases)), // when each version appeared
		timeSeriesChart(newChart("installs", "Installs", "exact count"), from, now,
			[]namedSeries{{Class: "s-installs", Values: installs}}, 0, math.NaN(), func(v float64) string { return groupDigits(int64(v)) + " installs" }))
	var days []stackedDays
	for _, rd := range d.ReviewDays {
		days = append(days, stackedDays{rd.Day, []int64{rd.Counts.Negative, rd.Counts.Neutral, rd.Counts.Positive, rd.Counts.None}})
	}
	reviewsTitle, reviewsFrom := "Reviews per day by sentiment", from
	if d.ReviewsUntil.Before(now) {
		reviewsTitle = "Reviews per day by sentiment, up to the newest review"
		reviewsFrom = d.ReviewsUntil.Add(-90 * 24 * time.Hour)
	}
	page.Charts = append(page.Charts, stackedBarChart(newChart("reviews", reviewsTitle, "reviews per day (UTC)"),
		reviewsFrom, d.ReviewsUntil, sentimentCategories, days))

	hist := newChart("histogram", "Rating histogram of the newest listing", "ratings")
	hist.Height, hist.Plot.H = 180, 180-marginTop-marginBottom
	var counts []int64
	if d.Latest != nil {
		for _, n := range d.Latest.Histogram {
			counts = append(counts, orZero(n))
		}
	} else {
		counts = make([]int64, 5)
	}
	page.Histogram = histogramChart(hist, []string{"1 ★", "2 ★", "3 ★", "4 ★", "5 ★"}, counts, []string{"h1", "h2", "h3", "h4", "h5"})

	page.Negative = negativeViews(d.Negative)

	page.Topics = topicViews(d.Topics)
	page.Releases = releasesSection{Rows: releaseViews(d.Releases), Chart: releasesChart(d.Releases)}

	page.ShowNet = d.Messaging || len(d.Network) > 0
	page.Network, page.RTT = networkViews(d.Network, from, now)
	return page
}

// negativeViews are the newest negative reviews as the app page lists them.
func negativeViews(reviews []negativeReview) []negativeView {
	var out []negativeView
	for _, r := range reviews {
		v := negativeView{When: r.At.UTC().Format("2 Jan 2006 15:04"), User: optString(r.UserName), Content: optString(r.Content),
			Version: optString(r.Version), Stars: "no stars"}
		if r.Score != nil {
			v.Stars = strings.Repeat("★", int(*r.Score)) + strings.Repeat("☆", 5-int(*r.Score))
		}
		v.Reply = optText(r.Reply)
		if r.RepliedAt != nil {
			v.RepliedAt = r.RepliedAt.UTC().Format("2 Jan 2006 15:04")
		}
		v.Why = "sentiment: negative"
		if r.Sentiment == nil {
			v.Why = "not scored yet: 1–2 stars"
		}
		out = append(out, v)
	}

	return out
}

// networkViews are the latest capture per scenario (the table) and the
// handshake RTT of the captures since from (the chart).
func networkViews(network []networkSample, from, now time.Time) ([]networkView, chart) {
	var views []networkView
	byScenario := map[string]*networkView{}
	var rtt []namedSeries
	for _, sc := range []string{"UPLOAD", "DOWNLOAD"} {
		var vals []timeValue
		for _, n := range network {
			if n.Scenario != sc {
				continue
			}
			if byScenario[sc] == nil { // newest first: the first is the latest
				v := networkView{Scenario: sc, When: n.At.UTC().Format("2 Jan 2006 15:04"), File: optString(n.File),
					RTT: optFloat(n.RTT, "%.2f ms"), Retrans: groupDigits(int64(n.Retransmissions)), OutOfOrder: groupDigits(int64(n.OutOfOrder)),
					ZeroWin: groupDigits(int64(n.ZeroWindows)), Resets: groupDigits(int64(n.Resets)), Bytes: groupDigits(n.BytesTotal),
					Overhead: fmt.Sprintf("%.1f %%", n.Overhead*100)}
				byScenario[sc] = &v
			}
			byScenario[sc].Captures++
			// The table keeps the latest capture however old; the chart
			// draws its 90 days only.
			if n.RTT != nil && n.At.After(from) {
				vals = append(vals, timeValue{n.At, *n.RTT})
			}
		}
		if v := byScenario[sc]; v != nil {
			views = append(views, *v)
		}
		slices.Reverse(vals)
		rtt = append(rtt, namedSeries{Name: strings.ToLower(sc), Class: "s-" + strings.ToLower(sc), Values: vals})
	}
	return views, timeSeriesChart(newChart("rtt", "TCP handshake RTT per analysed capture", "milliseconds"), from, now, rtt, 0, math.NaN(),
		func(v float64) string { return fmt.Sprintf("%.2f ms", v) })
}

// installsOf is a listing's installs as the page shows them, with the
// tooltip that says which count it is.
func installsOf(realInstalls, minInstalls *int64) (value, title string) {
	switch {
	case realInstalls != nil:
		return groupDigits(*realInstalls), "exact install count"
	case minInstalls != nil:
		return "≥ " + groupDigits(*minInstalls), "the store showed only its installs bucket"
	}
	return "—", ""
}

func firstNonNil(vs ...*int64) *int64 {
	for _, v := range vs {
		if v != nil {
			return v
		}
	}
	return nil
}

func orZero(n *int64) int64 {
	if n == nil {
		return 0
	}
	return *n
}

func optInt(n *int64) string {
	if n == nil {
		return "—"
	}
	return groupDigits(*n)
}

func optFloat(v *float64, format string) string {
	if v == nil {
		return "—"
	}
	return fmt.Sprintf(format, *v)
}

func optString(s *string) string {
	if s == nil || *s == "" {
		return "—"
	}
	return *s
}

func (p *statusPage) render(w http.ResponseWriter, r *http.Request, name string, data any) {
	var buf bytes.Buffer
	if err := statusTemplates.ExecuteTemplate(&buf, name, data); err != nil {
		p.fail(w, r, fmt.Errorf("status page: render %s: %w", name, err))
		return
	}
	writeHTML(w, statusCSP, http.StatusOK, buf.Bytes())
}

// writeHTML answers a rendered page with its Content-Security-Policy.
func writeHTML(w http.ResponseWriter, csp string, code int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

type messagePage struct{ Title, Message, Generated, Link, LinkText string }

func (p *statusPage) notFound(w http.ResponseWriter, r *http.Request, pkg string) {
	var buf bytes.Buffer
	_ = statusTemplates.ExecuteTemplate(&buf, "message", messagePage{Title: "No such app · playwatch status",
		Message: "No app is registered as " + pkg + "."})
	writeHTML(w, statusCSP, http.StatusNotFound, buf.Bytes())
}

// unavailable answers 503 with Retry-After: come back in a moment.
func (p *statusPage) unavailable(w http.ResponseWriter, title, message string) {
	var buf bytes.Buffer
	_ = statusTemplates.ExecuteTemplate(&buf, "message", messagePage{Title: title, Message: message})
	w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds))
	writeHTML(w, statusCSP, http.StatusServiceUnavailable, buf.Bytes())
}

func (p *statusPage) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(r.Context().Err(), context.Canceled) {
		return // the client went away
	}
	if isStatementTimeout(err) {
		p.logger.Warn("status page: a read ran past READ_STATEMENT_TIMEOUT", "path", r.URL.Path, "err", err)
		p.unavailable(w, "Status page unavailable",
			"The database took longer than READ_STATEMENT_TIMEOUT to answer the page's reads; try again in a few seconds.")
		return
	}
	p.logger.Error("status page failed", "path", r.URL.Path, "err", err)
	var buf bytes.Buffer
	_ = statusTemplates.ExecuteTemplate(&buf, "message", messagePage{Title: "Status page unavailable",
		Message: "The status page cannot read the database right now; the server log says why."})
	writeHTML(w, statusCSP, http.StatusInternalServerError, buf.Bytes())
}
