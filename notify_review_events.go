package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// Review events. A review's text version enters the decider's view twice:
// when it is stored (first_seen_at, for a new review) and when the
// sentiment job has scored it (sentiment_at, also for a text its author
// changed, which the job scores again). Each pass reads both since its
// cursors, less a margin, and the new reviews as far back as the sentiment
// wait, so that a review a rule waits for is read again until it is
// scored or the wait is over. The event key holds the text's hash
// (reviews_sentiment_input(score, content), the sentiment job's), so a
// re-read decides nothing new and an edited text is a new event.

const (
	cursorReviewsNew    = "reviews_new"
	cursorReviewsScored = "reviews_scored"
)

// reviewCandidate is one stored review version the rules are matched
// against.
type reviewCandidate struct {
	App        notifyApp
	ReviewID   string
	UserName   string
	Stars      int
	Text       string
	At         time.Time
	AppVersion string
	Reply      string
	RepliedAt  *time.Time
	FirstSeen  time.Time
	LastSynced time.Time
	Scored     bool // the job's label is for this text and stars
	Sentiment  string
	TextLang   string
	Hash       string
	// Storefronts are those the review was seen in as a new review (not in
	// a storefront's first crawl), first seen first; a review stored
	// without any (by an older playwatch) is in its app's first storefront.
	// App.Loc is the first; a rule's event names the first of them the
	// rule names.
	Storefronts []locale

	words []string // the normalised words, computed at the first keyword rule
}

// The candidates: active apps only, and never a review of the app's first
// stored crawl (its whole history) or older: its at must be after that
// crawl, the earlier of the app's first app_stats row and its first stored
// review (an app whose listing was never stored still has a first crawl).
// The same holds per storefront: a storefront added to an app brings its
// history with its first crawl, and a review is in a storefront for the
// rules only when it is newer than that storefront's first crawl.
const reviewCandidatesSQL = `SELECT a.id, a.package_name, coalesce(nullif(a.display_name, ''), a.package_name), a.is_iranian_app,
	r.review_id, coalesce(r.user_name, ''), coalesce(r.score, 0)::int, coalesce(r.content, ''), r.at, coalesce(r.app_version, ''),
	coalesce(r.reply_content, ''), r.replied_at, r.first_seen_at, r.last_synced_at,
	(r.sentiment IS NOT NULL AND r.sentiment_at IS NOT NULL AND r.sentiment_text_hash = reviews_sentiment_input(r.score, r.content)),
	coalesce(r.sentiment, ''), coalesce(r.text_lang, ''), encode(reviews_sentiment_input(r.score, r.content), 'hex'),
	array(SELECT rs.country || ' ' || rs.lang FROM review_storefronts rs WHERE rs.review_id = r.id
		AND r.at > least((SELECT min(s.crawled_at) FROM app_stats s WHERE s.application_id = rs.application_id AND s.country = rs.country AND s.lang = rs.lang),
			(SELECT min(f.first_seen_at) FROM review_storefronts f WHERE f.application_id = rs.application_id AND f.country = rs.country AND f.lang = rs.lang))
		ORDER BY rs.first_seen_at, rs.country, rs.lang),
	EXISTS (SELECT FROM review_storefronts rs WHERE rs.review_id = r.id),
	(SELECT f.country || ' ' || f.lang FROM app_storefronts f WHERE f.application_id = a.id ORDER BY f.position LIMIT 1)
FROM reviews r JOIN apps_registry_application a ON a.id = r.application_id
WHERE a.is_active AND r.at > $3
  AND r.at > least((SELECT min(s.crawled_at) FROM app_stats s WHERE s.application_id = r.application_id),
	(SELECT min(f.first_seen_at) FROM reviews f WHERE f.application_id = r.application_id))
  AND ($4::text[] IS NULL OR a.package_name = ANY($4))
  AND `

// decideReviews matches the review rules against the reviews stored or
// scored since the last pass, and against the backfill of a rule that is
// new or was edited.
func (d *notifyDecider) decideReviews(ctx context.Context, tx pgx.Tx, rules []notifyRule, now time.Time) ([]outboxRow, error) {
	window := d.cfg.SentimentWait + notifyCursorMargin
	newSince, err := readCursor(ctx, tx, cursorReviewsNew)
	if errors.Is(err, errNoCursor) {
		newSince = now
	} else if err != nil {
		return nil, err
	}
	scoredSince, err := readCursor(ctx, tx, cursorReviewsScored)
	if errors.Is(err, errNoCursor) {
		scoredSince = now
	} else if err != nil {
		return nil, err
	}
	var out []outboxRow
	if len(rules) > 0 {
		earliest := ruleStart(rules[0])
		for _, r := range rules[1:] {
			earliest = minTime(earliest, ruleStart(r))
		}
		cands, err := queryReviewCandidates(ctx, tx, d.cfg.Locales,
			// A review first stored from another storefront is new to a
			// rule that names only the one it is seen in now.
			reviewCandidatesSQL+`(r.first_seen_at > $1 OR r.sentiment_at > $2
	OR r.id = ANY(ARRAY(SELECT rs.review_id FROM app_storefronts f JOIN review_storefronts rs
		ON rs.application_id = f.application_id AND rs.country = f.country AND rs.lang = f.lang AND rs.first_seen_at > $1)))`,
			newSince.Add(-window), scoredSince.Add(-notifyCursorMargin), earliest, nil)
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			out = append(out, d.matchReviews(r, cands, now)...)
		}
		backfill, err := d.backfillReviews(ctx, tx, rules, now)
		if err != nil {
			return nil, err
		}
		out = append(out, backfill...)
	}
	if err := writeCursor(ctx, tx, cursorReviewsNew, now); err != nil {
		return nil, err
	}
	if err := writeCursor(ctx, tx, cursorReviewsScored, now); err != nil {
		return nil, err
	}
	return out, nil
}

// backfillReviews reads, once per version of a rule (its updated_at), the
// reviews a pass may not have matched it against: for a new rule, every
// review since its start (what was stored before it, its backfill, or
// between its creation and this pass); for an edited one, only those since
// the edit less its backfill, so that a rename, or a destination added to a
// months-old rule, does not send months of reviews again.
func (d *notifyDecider) backfillReviews(ctx context.Context, tx pgx.Tx, rules []notifyRule, now time.Time) ([]outboxRow, error) {
	ids := make([]int64, len(rules))
	for i, r := range rules {
		ids[i] = r.ID
	}
	// edited: the rule was scanned before, at another version.
	type scan struct {
		ID     int64
		Edited bool
	}
	todo, err := queryAll(ctx, tx, "notify decide: rule scans", pgx.RowToStructByPos[scan], `SELECT u.id, s.rule_id IS NOT NULL FROM unnest($1::bigint[]) AS u(id)
LEFT JOIN notify_rule_scans s ON s.rule_id = u.id
JOIN notify_rules r ON r.id = u.id
WHERE s.rule_updated_at IS DISTINCT FROM r.updated_at`, ids)
	if err != nil {
		return nil, err
	}
	var out []outboxRow
	for _, r := range rules {
		i := slices.IndexFunc(todo, func(s scan) bool { return s.ID == r.ID })
		if i < 0 {
			continue
		}
		after := ruleStart(r)
		if edit := r.UpdatedAt.Add(-r.Backfill); todo[i].Edited && edit.After(after) {
			after = edit
		}
		cands, err := queryReviewCandidates(ctx, tx, d.cfg.Locales, reviewCandidatesSQL+`$1::timestamptz IS NULL AND $2::timestamptz IS NULL`, nil, nil, after, r.Apps)
		if err != nil {
			return nil, err
		}
		out = append(out, d.matchReviews(r, cands, now)...)
		if _, err := tx.Exec(ctx, `INSERT INTO notify_rule_scans (rule_id, rule_updated_at) VALUES ($1, $2)
ON CONFLICT (rule_id) DO UPDATE SET rule_updated_at = EXCLUDED.rule_updated_at`, r.ID, r.UpdatedAt); err != nil {
			return nil, fmt.Errorf("notify decide: rule scans: %w", err)
		}
	}
	return out, nil
}

func queryReviewCandidates(ctx context.Context, tx pgx.Tx, locales localeDefaults, sql string, newSince, scoredSince any, after time.Time, apps []string) ([]*reviewCandidate, error) {
	rows, err := tx.Query(ctx, sql, newSince, scoredSince, after, apps)
	if err != nil {
		return nil, fmt.Errorf("notify decide: reviews: %w", err)
	}
	defer rows.Close()
	var out []*reviewCandidate
	for rows.Next() {
		c := &reviewCandidate{}
		var iranian bool
		var seenIn []string
		var inAny bool
		var first *string
		if err := rows.Scan(&c.App.ID, &c.App.PackageName, &c.App.DisplayName, &iranian,
			&c.ReviewID, &c.UserName, &c.Stars, &c.Text, &c.At, &c.AppVersion, &c.Reply, &c.RepliedAt, &c.FirstSeen, &c.LastSynced,
			&c.Scored, &c.Sentiment, &c.TextLang, &c.Hash, &seenIn, &inAny, &first); err != nil {
			return nil, fmt.Errorf("notify decide: reviews: %w", err)
		}
		for _, s := range seenIn {
			c.Storefronts = append(c.Storefronts, splitStorefront(s))
		}
		if !inAny {
			loc := locales.forApp(iranian)
			if first != nil {
				loc = splitStorefront(*first)
			}
			c.Storefronts = []locale{loc}
		}
		if len(c.Storefronts) == 0 {
			continue // only in storefronts whose first crawl brought it
		}
		c.App.Loc = c.Storefronts[0]
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("notify decide: reviews: %w", err)
	}
	return out, nil
}

// matchReviews is the outbox rows of rule r for the candidates that match
// it now; a candidate the rule waits for (no label yet, within the wait)
// gives none and is read again by the next passes.
func (d *notifyDecider) matchReviews(r notifyRule, cands []*reviewCandidate, now time.Time) []outboxRow {
	f := r.Filter
	needsLabel := len(f.Sentiment) > 0 || len(f.TextLang) > 0
	keywords := make([][]string, 0, len(f.Keywords))
	for _, k := range f.Keywords {
		if w := sentimentWords(k); len(w) > 0 {
			keywords = append(keywords, w)
		}
	}
	start := ruleStart(r)
	var out []outboxRow
	for _, c := range cands {
		if (r.Apps != nil && !slices.Contains(r.Apps, c.App.PackageName)) || !c.At.After(start) {
			continue
		}
		in := slices.IndexFunc(c.Storefronts, f.namesStorefront)
		if in < 0 {
			continue
		}
		label, lang, fromStars := c.Sentiment, c.TextLang, false
		if lang == "" { // scored before the job wrote text_lang
			lang = detectSentimentLang(c.Text)
		}
		if !c.Scored {
			if needsLabel && now.Before(c.storedAt().Add(d.cfg.SentimentWait)) {
				continue // the sentiment job may still label it
			}
			label, lang, fromStars = starSentiment(c.Stars), detectSentimentLang(c.Text), true
		}
		if !reviewMatches(f, c, label, lang, keywords) {
			continue
		}
		app := c.App
		app.Loc = c.Storefronts[in]
		p := d.payloadOf("review", app)
		p.Review = &payloadReview{ReviewID: c.ReviewID, UserName: c.UserName, Stars: c.Stars, Text: c.Text, At: c.At.UTC(),
			AppVersion: c.AppVersion, Sentiment: label, SentimentFromStars: fromStars, TextLang: lang,
			ReplyText: c.Reply, RepliedAt: c.RepliedAt, URL: playURL(app.PackageName, app.Loc.Lang, c.ReviewID)}
		at := c.At
		// One message per review and rule, whichever storefronts it is in.
		out = append(out, fanOut(r, "review:"+c.ReviewID+":"+c.Hash, p, c.storedAt(), &at)...)
	}
	return out
}

// storedAt is when this version of the review was stored: first_seen_at
// for a new review, its crawl for a text its author changed (Google Play
// gives an edited review a new at, after the review was first seen).
func (c *reviewCandidate) storedAt() time.Time {
	if c.At.After(c.FirstSeen) && c.LastSynced.After(c.FirstSeen) {
		return c.LastSynced
	}
	return c.FirstSeen
}

// starSentiment is the label of the stars alone, as the sentiment job gives
// a review its model failed on.
func starSentiment(stars int) string {
	return fuseSentiment([sentClasses]float64{0, 1, 0}, stars, "other").Label
}

func reviewMatches(f ruleFilter, c *reviewCandidate, label, lang string, keywords [][]string) bool {
	if f.MaxStars != nil && (c.Stars < 1 || c.Stars > *f.MaxStars) {
		return false
	}
	if f.MinLength != nil && utf8.RuneCountInString(strings.TrimSpace(c.Text)) < *f.MinLength {
		return false
	}
	if len(f.Sentiment) > 0 && !slices.ContainsFunc(f.Sentiment, func(s string) bool { return strings.EqualFold(s, label) }) {
		return false
	}
	if len(f.TextLang) > 0 && !slices.ContainsFunc(f.TextLang, func(s string) bool { return strings.EqualFold(s, lang) }) {
		return false
	}
	if len(keywords) > 0 {
		if c.words == nil {
			c.words = sentimentWords(c.Text)
		}
		if !slices.ContainsFunc(keywords, func(k []string) bool { return containsWords(c.words, k) }) {
			return false
		}
	}
	return true
}

// sentimentWords is s as the sentiment code reads it: normalised (Arabic
// letters to Persian, ZWNJ and diacritics dropped, case folded) and split
// into words, Persian affixes written apart joined to their word
// (sentiment_text.go); punctuation is dropped.
func sentimentWords(s string) []string {
	var sc sentScratch
	sc.norm = normalizeSentimentText(nil, s)
	tokenizeSentiment(&sc)
	words := make([]string, 0, len(sc.toks))
	for _, t := range sc.toks {
		if t.kind != tokBreak {
			words = append(words, string(sc.tb[t.s:t.e]))
		}
	}
	return words
}

// containsWords says whether kw occurs in words as whole consecutive words.
func containsWords(words, kw []string) bool {
	for i := 0; i+len(kw) <= len(words); i++ {
		if slices.Equal(words[i:i+len(kw)], kw) {
			return true
		}
	}
	return false
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// unixKey is a time as an event key writes it.
func unixKey(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
