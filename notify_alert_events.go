package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Alert events: the conditions of deploy/prometheus/alerts.yml, evaluated
// in PostgreSQL with the same defaults. Each rule keeps its open episodes
// in notify_alert_state, so an alert fires once when it starts (and
// crawl_failing once more when it ends), never again while it lasts.

// How long a condition must hold before its alert fires: the for: of
// PlaywatchRatingDrop and PlaywatchAppNotCrawled, so that a team gets the
// same answer from both (a package the store answers 404 for fires at once,
// as the issue asks). The alert's start is still when the condition began.
const (
	ratingDropFor   = 15 * time.Minute
	crawlFailingFor = 10 * time.Minute
)

// alertFor is how long o must hold before rule event's alert fires.
func alertFor(event string, o alertObs) time.Duration {
	switch {
	case event == "rating_drop":
		return ratingDropFor
	case event == "crawl_failing" && o.Alert.Value != crawlNotFound:
		return crawlFailingFor
	}
	return 0
}

// The defaults of PlaywatchRatingDrop and PlaywatchNegativeReviewSpike.
const (
	defaultMinDrop  = 0.05
	defaultWindow   = 24 * time.Hour
	defaultMinCount = 5
	defaultFactor   = 3.0
)

// alertObs is one app's (and storefront's, and for crawl_failing path's)
// condition at this pass.
type alertObs struct {
	App    notifyApp
	Path   string // crawl_failing: stats or reviews; "" otherwise
	Active bool
	Start  time.Time    // when Active: when the episode started
	End    time.Time    // when not Active: when it ended (crawl_failing)
	Cause  string       // crawl_failing: the last outcome that explains it
	Alert  payloadAlert // the start message's kind, summary, value, previous
	KeyAt  time.Time    // the start as the event key says it (negative_spike: its hour)
}

type alertStateKey struct {
	App           int64
	Country, Lang string
	Path          string
}

type alertState struct {
	Started time.Time
	Cause   string
	Fired   bool // its start message was decided (it held alertFor)
}

func (d *notifyDecider) decideAlerts(ctx context.Context, tx pgx.Tx, byEvent map[string][]notifyRule, now time.Time) ([]outboxRow, error) {
	var out []outboxRow
	// episodesOf runs the episodes of each of rules on what observe sees
	// for it; ends: the event has an end message.
	episodesOf := func(rules []notifyRule, ends bool, observe func(notifyRule) ([]alertObs, error)) error {
		for _, r := range rules {
			obs, err := observe(r)
			if err != nil {
				return err
			}
			rows, err := d.episodes(ctx, tx, r, obs, ends, now)
			if err != nil {
				return err
			}
			out = append(out, rows...)
		}
		return nil
	}
	crawl, err := d.crawlStreaks(ctx, tx, now)
	if err != nil {
		return nil, err
	}
	if err := episodesOf(byEvent["crawl_failing"], true, func(notifyRule) ([]alertObs, error) { return crawl, nil }); err != nil {
		return nil, err
	}
	if err := episodesOf(byEvent["rating_drop"], false, func(r notifyRule) ([]alertObs, error) { return d.ratingDrops(ctx, tx, r, now) }); err != nil {
		return nil, err
	}
	if rules := byEvent["negative_spike"]; len(rules) > 0 {
		counts, err := d.negativeCounts(ctx, tx, now)
		if err != nil {
			return nil, err
		}
		if err := episodesOf(rules, false, func(r notifyRule) ([]alertObs, error) { return negativeSpikes(r, counts), nil }); err != nil {
			return nil, err
		}
	}
	if rules := byEvent["new_version"]; len(rules) > 0 {
		rows, err := d.newVersions(ctx, tx, rules)
		if err != nil {
			return nil, err
		}
		out = append(out, rows...)
	}
	return out, nil
}

// episodes opens and closes rule r's episodes by this pass's observations
// and gives the messages: one when an episode that started after the
// rule's start has held alertFor, and with ends, one when such an episode
// ends. An episode is stored when its condition is first seen, so that
// the wait counts from then, as Prometheus's for: does.
func (d *notifyDecider) episodes(ctx context.Context, tx pgx.Tx, r notifyRule, obs []alertObs, ends bool, now time.Time) ([]outboxRow, error) {
	rows, err := tx.Query(ctx, `SELECT application_id, country, lang, path, started_at, cause, fired_at IS NOT NULL FROM notify_alert_state WHERE rule_id = $1`, r.ID)
	if err != nil {
		return nil, fmt.Errorf("notify decide: alert state: %w", err)
	}
	state := map[alertStateKey]alertState{}
	var k alertStateKey
	var s alertState
	if _, err := pgx.ForEachRow(rows, []any{&k.App, &k.Country, &k.Lang, &k.Path, &s.Started, &s.Cause, &s.Fired}, func() error {
		state[k] = s
		return nil
	}); err != nil {
		return nil, fmt.Errorf("notify decide: alert state: %w", err)
	}
	start := ruleStart(r)
	seen := map[alertStateKey]bool{}
	var out []outboxRow
	// fire decides the start message of o's episode, begun at began, once it
	// has held long enough, and marks the episode fired.
	fire := func(k alertStateKey, o alertObs, began, keyAt time.Time) error {
		if now.Before(began.Add(alertFor(r.Event, o))) {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE notify_alert_state SET fired_at = $6
WHERE rule_id = $1 AND application_id = $2 AND country = $3 AND lang = $4 AND path = $5`, r.ID, k.App, k.Country, k.Lang, k.Path, now); err != nil {
			return fmt.Errorf("notify decide: alert state: %w", err)
		}
		if began.Before(start) {
			return nil // began before the rule: not news, and no end message either
		}
		p := d.payloadOf(r.Event, o.App)
		a := o.Alert
		a.Kind, a.StartedAt = r.Event, began.UTC()
		p.Alert = &a
		out = append(out, fanOut(r, alertKey(r.Event, o, keyAt), p, began, nil)...)
		return nil
	}
	for _, o := range obs {
		if (r.Apps != nil && !slices.Contains(r.Apps, o.App.PackageName)) || !r.Filter.namesStorefront(o.App.Loc) { // nil apps: every active app
			continue
		}
		k := alertStateKey{o.App.ID, o.App.Loc.Country, o.App.Loc.Lang, o.Path}
		seen[k] = true
		st, open := state[k]
		switch {
		case o.Active && open && (!ends || st.Started.Equal(o.Start)):
			// Still the same episode; its end message names the last cause.
			if o.Cause != st.Cause {
				if _, err := tx.Exec(ctx, `UPDATE notify_alert_state SET cause = $6
WHERE rule_id = $1 AND application_id = $2 AND country = $3 AND lang = $4 AND path = $5`, r.ID, k.App, k.Country, k.Lang, k.Path, o.Cause); err != nil {
					return nil, fmt.Errorf("notify decide: alert state: %w", err)
				}
			}
			if !st.Fired {
				if err := fire(k, o, st.Started, st.Started); err != nil {
					return nil, err
				}
			}
		case o.Active:
			if open && st.Fired && !st.Started.Before(start) { // ended and started again between two passes
				out = append(out, d.endMessage(r, o, st, o.Start)...)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO notify_alert_state (rule_id, application_id, country, lang, path, started_at, cause)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (rule_id, application_id, country, lang, path) DO UPDATE SET started_at = EXCLUDED.started_at, cause = EXCLUDED.cause, fired_at = NULL`,
				r.ID, k.App, k.Country, k.Lang, k.Path, o.Start, o.Cause); err != nil {
				return nil, fmt.Errorf("notify decide: alert state: %w", err)
			}
			if err := fire(k, o, o.Start, o.KeyAt); err != nil {
				return nil, err
			}
		case open:
			if err := deleteAlertState(ctx, tx, r.ID, k); err != nil {
				return nil, err
			}
			if ends && st.Fired && !st.Started.Before(start) {
				out = append(out, d.endMessage(r, o, st, o.End)...)
			}
		}
	}
	for k := range state {
		if !seen[k] { // the app left the rule, or is no longer active
			if err := deleteAlertState(ctx, tx, r.ID, k); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

func deleteAlertState(ctx context.Context, tx pgx.Tx, rule int64, k alertStateKey) error {
	if _, err := tx.Exec(ctx, `DELETE FROM notify_alert_state WHERE rule_id = $1 AND application_id = $2 AND country = $3 AND lang = $4 AND path = $5`,
		rule, k.App, k.Country, k.Lang, k.Path); err != nil {
		return fmt.Errorf("notify decide: alert state: %w", err)
	}
	return nil
}

// endMessage says that the episode st of o's app ended at ended.
func (d *notifyDecider) endMessage(r notifyRule, o alertObs, st alertState, ended time.Time) []outboxRow {
	p := d.payloadOf(r.Event, o.App)
	e := ended.UTC()
	p.Alert = &payloadAlert{Kind: r.Event, Summary: fmt.Sprintf("%s (%s): crawled successfully again", o.App.PackageName, o.Path),
		Value: crawlOK, Previous: st.Cause, StartedAt: st.Started.UTC(), EndedAt: &e}
	return fanOut(r, alertKey(r.Event, o, st.Started)+":end", p, ended, nil)
}

// alertKey is kind, app, storefront, path (crawl_failing) and start.
func alertKey(kind string, o alertObs, at time.Time) string {
	k := kind + ":" + storefrontKey(o.App)
	if o.Path != "" {
		k += ":" + o.Path
	}
	return k + ":" + unixKey(at)
}

// crawlStreaks follows every active app's crawl outcomes into
// notify_crawl_streaks and says, per app, storefront and path, whether it
// is failing as PlaywatchAppNotCrawled defines it: no success for two
// crawl intervals, or two failures in a row; a package the store answers
// 404 for fails at once (not_found). A canceled crawl counts neither way.
// The first time a path is seen, its streak is this one outcome, and the
// listing's last success is its newest stored app_stats row.
func (d *notifyDecider) crawlStreaks(ctx context.Context, tx pgx.Tx, now time.Time) ([]alertObs, error) {
	rows, err := tx.Query(ctx, `SELECT o.application_id, a.package_name, coalesce(nullif(a.display_name, ''), a.package_name),
	o.country, o.lang, o.path, o.at, o.outcome, o.http_status, o.error,
	s.application_id IS NOT NULL, s.outcome_at, coalesce(s.failures, 0), s.last_ok_at, s.failing_since,
	(SELECT max(st.crawled_at) FROM app_stats st WHERE st.application_id = o.application_id AND st.country = o.country AND st.lang = o.lang)
FROM app_crawl_outcomes o JOIN apps_registry_application a ON a.id = o.application_id
LEFT JOIN notify_crawl_streaks s ON s.application_id = o.application_id AND s.country = o.country AND s.lang = o.lang AND s.path = o.path
WHERE a.is_active
ORDER BY o.application_id, o.country, o.lang, o.path`)
	if err != nil {
		return nil, fmt.Errorf("notify decide: crawl outcomes: %w", err)
	}
	type streak struct {
		o                alertObs
		at               time.Time
		outcome, errText string
		status           *int
		exists           bool
		outcomeAt        *time.Time
		failures         int
		lastOK, since    *time.Time
		newestStats      *time.Time
	}
	var all []*streak
	for rows.Next() {
		s := &streak{}
		if err := rows.Scan(&s.o.App.ID, &s.o.App.PackageName, &s.o.App.DisplayName, &s.o.App.Loc.Country, &s.o.App.Loc.Lang, &s.o.Path,
			&s.at, &s.outcome, &s.status, &s.errText, &s.exists, &s.outcomeAt, &s.failures, &s.lastOK, &s.since, &s.newestStats); err != nil {
			rows.Close()
			return nil, fmt.Errorf("notify decide: crawl outcomes: %w", err)
		}
		all = append(all, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("notify decide: crawl outcomes: %w", err)
	}
	twice := 2 * d.cfg.CrawlInterval
	obs := make([]alertObs, 0, len(all))
	for _, s := range all {
		failures, lastOK, since := s.failures, s.lastOK, s.since
		if !s.exists && s.o.Path == "stats" && s.newestStats != nil {
			lastOK = s.newestStats
		}
		fresh := !s.exists || s.at.After(*s.outcomeAt)
		if fresh {
			switch s.outcome {
			case crawlOK:
				at := s.at
				failures, lastOK = 0, &at
			case crawlCanceled:
			default:
				failures++
			}
		}
		aged := twice > 0 && lastOK != nil && now.Sub(*lastOK) > twice
		failing := s.outcome == crawlNotFound || failures >= 2 || aged
		switch {
		case !failing:
			since = nil
		case since == nil:
			at := s.at
			if s.outcome == crawlOK { // only aged: the crawls stopped
				at = lastOK.Add(twice)
			}
			since = &at
		}
		if fresh || !equalTimePtr(since, s.since) {
			if _, err := tx.Exec(ctx, `INSERT INTO notify_crawl_streaks (application_id, country, lang, path, outcome_at, failures, last_ok_at, failing_since)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (application_id, country, lang, path) DO UPDATE SET outcome_at = EXCLUDED.outcome_at, failures = EXCLUDED.failures,
	last_ok_at = EXCLUDED.last_ok_at, failing_since = EXCLUDED.failing_since`,
				s.o.App.ID, s.o.App.Loc.Country, s.o.App.Loc.Lang, s.o.Path, s.at, failures, lastOK, since); err != nil {
				return nil, fmt.Errorf("notify decide: crawl streaks: %w", err)
			}
		}
		o := s.o
		o.Cause = crawlFailureCause(s.outcome, s.status, s.errText)
		if since != nil {
			o.Active, o.Start, o.KeyAt = true, *since, *since
			summary := fmt.Sprintf("%s (%s) not crawled successfully for 2 intervals: %s", o.App.PackageName, o.Path, o.Cause)
			if s.outcome == crawlNotFound {
				summary = fmt.Sprintf("%s (%s): Google Play has no such app in this storefront (not_found)", o.App.PackageName, o.Path)
			}
			o.Alert = payloadAlert{Summary: summary, Value: s.outcome}
			if lastOK != nil {
				o.Alert.Previous = "last success " + lastOK.UTC().Format(time.RFC3339)
			}
		} else {
			o.End = s.at
		}
		obs = append(obs, o)
	}
	return obs, nil
}

func equalTimePtr(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// crawlFailureCause is an outcome as a message says it: "throttled (HTTP 429):
// the error".
func crawlFailureCause(outcome string, status *int, errText string) string {
	s := outcome
	if status != nil {
		s += " (HTTP " + strconv.Itoa(*status) + ")"
	}
	if errText != "" {
		s += ": " + errText
	}
	return s
}

// alertAppColumns are the columns of an alert query that name the app.
const alertAppColumns = `a.id, a.package_name, coalesce(nullif(a.display_name, ''), a.package_name), a.is_iranian_app`

// ratingDrops: PlaywatchRatingDrop, the newest score at least min_drop
// below the newest one window ago, of the same storefront (two storefronts
// are never compared); the episode starts with the crawl that showed the
// drop.
func (d *notifyDecider) ratingDrops(ctx context.Context, tx pgx.Tx, r notifyRule, now time.Time) ([]alertObs, error) {
	minDrop, window := defaultMinDrop, defaultWindow
	if r.Filter.MinDrop != nil {
		minDrop = *r.Filter.MinDrop
	}
	if r.Filter.Window != "" {
		w, err := parseDuration(r.Filter.Window)
		if err != nil || w <= 0 {
			d.logger.Error("notify rule's window cannot be read; the default applies", "rule", r.ID, "window", r.Filter.Window)
		} else {
			window = w
		}
	}
	rows, err := tx.Query(ctx, `SELECT `+alertAppColumns+`, sf.country, sf.lang, n.score, n.crawled_at, p.score
FROM apps_registry_application a
`+storefrontsLateral(3)+`
CROSS JOIN LATERAL (SELECT score, crawled_at FROM app_stats WHERE application_id = a.id AND country = sf.country AND lang = sf.lang ORDER BY crawled_at DESC LIMIT 1) n
CROSS JOIN LATERAL (SELECT score FROM app_stats WHERE application_id = a.id AND country = sf.country AND lang = sf.lang AND crawled_at <= $1 ORDER BY crawled_at DESC LIMIT 1) p
WHERE a.is_active AND n.score IS NOT NULL AND p.score IS NOT NULL AND ($2::text[] IS NULL OR a.package_name = ANY($2))`,
		append([]any{now.Add(-window), r.Apps}, d.cfg.Locales.args()...)...)
	if err != nil {
		return nil, fmt.Errorf("notify decide: rating drops: %w", err)
	}
	var obs []alertObs
	var o alertObs
	var iranian bool
	var score, before float64
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&o.App.ID, &o.App.PackageName, &o.App.DisplayName, &iranian, &o.App.Loc.Country, &o.App.Loc.Lang, &score, &at, &before}, func() error {
		x := alertObs{App: o.App}
		// The tolerance keeps 4.30 → 4.25 a drop of 0.05 in binary floating point.
		if before-score >= minDrop-1e-9 {
			x.Active, x.Start, x.KeyAt = true, at, at
			x.Alert = payloadAlert{Summary: fmt.Sprintf("%s: rating down %.2f in %s", x.App.PackageName, before-score, formatDuration(window)),
				Value: fmt.Sprintf("%.2f", score), Previous: fmt.Sprintf("%.2f", before)}
		}
		obs = append(obs, x)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("notify decide: rating drops: %w", err)
	}
	return obs, nil
}

// negativeCount is an app's negative reviews in one storefront of the last
// hour (their times, newest first) and of the last 7 days.
type negativeCount struct {
	App  notifyApp
	Hour []time.Time
	Week int
}

func (d *notifyDecider) negativeCounts(ctx context.Context, tx pgx.Tx, now time.Time) ([]negativeCount, error) {
	// A review stored without a storefront (by an older playwatch) counts in
	// its app's first storefront.
	rows, err := tx.Query(ctx, `SELECT `+alertAppColumns+`, rs.country || ' ' || rs.lang,
	(SELECT f.country || ' ' || f.lang FROM app_storefronts f WHERE f.application_id = a.id ORDER BY f.position LIMIT 1),
	coalesce(array_agg(r.at ORDER BY r.at DESC) FILTER (WHERE r.at > $1), '{}'), count(*)
FROM apps_registry_application a
JOIN reviews r ON r.application_id = a.id AND r.at > $2 AND r.at <= $3 AND r.sentiment = 'NEGATIVE'
LEFT JOIN review_storefronts rs ON rs.review_id = r.id
WHERE a.is_active
GROUP BY a.id, rs.country, rs.lang`, now.Add(-time.Hour), now.Add(-7*24*time.Hour), now)
	if err != nil {
		return nil, fmt.Errorf("notify decide: negative reviews: %w", err)
	}
	var out []negativeCount
	type key struct {
		app int64
		loc locale
	}
	index := map[key]int{}
	var c negativeCount
	var iranian bool
	var in, first *string
	if _, err := pgx.ForEachRow(rows, []any{&c.App.ID, &c.App.PackageName, &c.App.DisplayName, &iranian, &in, &first, &c.Hour, &c.Week}, func() error {
		x := c
		switch {
		case in != nil:
			x.App.Loc = splitStorefront(*in)
		case first != nil:
			x.App.Loc = splitStorefront(*first)
		default:
			x.App.Loc = d.cfg.Locales.forApp(iranian)
		}
		// The reviews without a storefront join those seen in the first one.
		i, ok := index[key{x.App.ID, x.App.Loc}]
		if !ok {
			index[key{x.App.ID, x.App.Loc}] = len(out)
			out = append(out, x)
			return nil
		}
		out[i].Hour = append(out[i].Hour, x.Hour...)
		slices.SortFunc(out[i].Hour, func(a, b time.Time) int { return b.Compare(a) })
		out[i].Week += x.Week
		return nil
	}); err != nil {
		return nil, fmt.Errorf("notify decide: negative reviews: %w", err)
	}
	return out, nil
}

// negativeSpikes: PlaywatchNegativeReviewSpike with the rule's min_count
// and factor. The episode starts at the review that made the count of the
// hour reach min_count (the min_count-th oldest of the hour); its key is
// that hour.
func negativeSpikes(r notifyRule, counts []negativeCount) []alertObs {
	minCount, factor := defaultMinCount, defaultFactor
	if r.Filter.MinCount != nil {
		minCount = max(*r.Filter.MinCount, 1)
	}
	if r.Filter.Factor != nil {
		factor = *r.Filter.Factor
	}
	obs := make([]alertObs, 0, len(counts))
	for _, c := range counts {
		o := alertObs{App: c.App}
		n, avg := len(c.Hour), float64(c.Week)/168
		if n >= minCount && float64(n) >= factor*avg {
			start := c.Hour[n-minCount] // the minCount-th of the hour, oldest first
			o.Active, o.Start, o.KeyAt = true, start, start.Truncate(time.Hour)
			o.Alert = payloadAlert{Summary: fmt.Sprintf("%s: %d negative reviews in the last hour", c.App.PackageName, n),
				Value: strconv.Itoa(n), Previous: fmt.Sprintf("%.1f", avg)}
		}
		obs = append(obs, o)
	}
	return obs
}

// newVersions: the newest listing's version differs from the one before
// it. The event is that crawl's; no state is needed, its key holds the
// version and the crawl.
func (d *notifyDecider) newVersions(ctx context.Context, tx pgx.Tx, rules []notifyRule) ([]outboxRow, error) {
	rows, err := tx.Query(ctx, `SELECT `+alertAppColumns+`, sf.country, sf.lang, v.version, v.score, v.crawled_at, p.version, p.score
FROM apps_registry_application a
`+storefrontsLateral(1)+`
CROSS JOIN LATERAL (SELECT version, score, crawled_at FROM app_stats
	WHERE application_id = a.id AND country = sf.country AND lang = sf.lang AND version IS NOT NULL ORDER BY crawled_at DESC LIMIT 1) v
CROSS JOIN LATERAL (SELECT version, score FROM app_stats
	WHERE application_id = a.id AND country = sf.country AND lang = sf.lang AND version IS NOT NULL AND crawled_at < v.crawled_at ORDER BY crawled_at DESC LIMIT 1) p
WHERE a.is_active AND v.version <> p.version`, d.cfg.Locales.args()...)
	if err != nil {
		return nil, fmt.Errorf("notify decide: versions: %w", err)
	}
	var out []outboxRow
	var app notifyApp
	var iranian bool
	var version, prevVersion string
	var score, prevScore *float64
	var at time.Time
	if _, err := pgx.ForEachRow(rows, []any{&app.ID, &app.PackageName, &app.DisplayName, &iranian, &app.Loc.Country, &app.Loc.Lang, &version, &score, &at, &prevVersion, &prevScore}, func() error {
		a := app
		for _, r := range rules {
			if (r.Apps != nil && !slices.Contains(r.Apps, a.PackageName)) || !r.Filter.namesStorefront(a.Loc) || at.Before(ruleStart(r)) {
				continue
			}
			p := d.payloadOf(r.Event, a)
			after, before := formatScore(score), formatScore(prevScore)
			p.Alert = &payloadAlert{Kind: r.Event, StartedAt: at.UTC(), Value: after, Previous: before,
				Summary: fmt.Sprintf("%s: version %s → %s (rating %s → %s)", a.PackageName, prevVersion, version, before, after)}
			out = append(out, fanOut(r, "new_version:"+storefrontKey(a)+":"+version+":"+unixKey(at), p, at, nil)...)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("notify decide: versions: %w", err)
	}
	return out, nil
}

func formatScore(s *float64) string {
	if s == nil {
		return "?"
	}
	return fmt.Sprintf("%.2f", *s)
}
