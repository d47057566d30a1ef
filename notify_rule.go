package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// A notifyRule says which events go to which destinations (schema.sql,
// migration 12; the registry API writes it, the notifier reads it).
type notifyRule struct {
	ID           int64
	Name         string
	Event        string   // review, rating_drop, negative_spike, crawl_failing, new_version
	Destinations []int64  // notify_rule_destinations
	Apps         []string // nil: every active app
	Filter       ruleFilter
	MaxPerHour   int           // 0: no limit
	Backfill     time.Duration // events this long before the rule's creation count too
	CreatedAt    time.Time
	UpdatedAt    time.Time
}

// ruleFilter holds every event's conditions; each event reads its own. A
// nil pointer or empty list is "not given": the event's default applies
// (the defaults of deploy/prometheus/alerts.yml where both have the rule).
type ruleFilter struct {
	// review
	MaxStars  *int     `json:"max_stars,omitempty"`
	Sentiment []string `json:"sentiment,omitempty"` // POSITIVE, NEUTRAL, NEGATIVE
	TextLang  []string `json:"text_lang,omitempty"` // fa, en, other
	Keywords  []string `json:"keywords,omitempty"`  // any of, on the normalised text
	MinLength *int     `json:"min_length,omitempty"`
	// rating_drop (PlaywatchRatingDrop: 0.05 against 24h ago)
	MinDrop *float64 `json:"min_drop,omitempty"`
	Window  string   `json:"window,omitempty"` // a duration (parseDuration: 24h, 7d)
	// negative_spike (PlaywatchNegativeReviewSpike: ≥ 5 in the last hour and ≥ 3 × the hourly average of the last 7 days)
	MinCount *int     `json:"min_count,omitempty"`
	Factor   *float64 `json:"factor,omitempty"`
	// every event: the storefronts of the app the rule is for (none: all)
	Storefronts []locale `json:"storefronts,omitempty"`
}

// namesStorefront says whether the rule is for events of storefront loc.
func (f ruleFilter) namesStorefront(loc locale) bool {
	return len(f.Storefronts) == 0 || slices.Contains(f.Storefronts, loc)
}

const ruleColumns = `r.id, r.name, r.event, coalesce(array(SELECT destination_id FROM notify_rule_destinations WHERE rule_id = r.id ORDER BY destination_id), '{}'),
	r.apps, r.filter, r.max_per_hour, extract(epoch FROM r.backfill)::float8, r.created_at, r.updated_at`

func scanRule(row pgx.CollectableRow) (notifyRule, error) {
	var r notifyRule
	var filter []byte
	var backfill float64
	if err := row.Scan(&r.ID, &r.Name, &r.Event, &r.Destinations, &r.Apps, &filter, &r.MaxPerHour, &backfill, &r.CreatedAt, &r.UpdatedAt); err != nil {
		return notifyRule{}, err
	}
	if err := json.Unmarshal(filter, &r.Filter); err != nil {
		return notifyRule{}, fmt.Errorf("rule %d: filter: %w", r.ID, err)
	}
	r.Backfill = time.Duration(backfill * float64(time.Second))
	return r, nil
}

// loadRules reads the rules of one event ("" for all), in id order. With
// skip, a rule that cannot be read is given to it and left out, so that it
// does not stop the others; without, it is an error.
func loadRules(ctx context.Context, q querier, event string, skip func(error)) ([]notifyRule, error) {
	rows, err := q.Query(ctx, `SELECT `+ruleColumns+` FROM notify_rules r WHERE $1 = '' OR r.event = $1 ORDER BY r.id`, event)
	if err != nil {
		return nil, fmt.Errorf("load rules: %w", err)
	}
	defer rows.Close()
	var rules []notifyRule
	for rows.Next() {
		r, err := scanRule(rows)
		if err != nil && skip != nil {
			skip(err)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("load rules: %w", err)
		}
		rules = append(rules, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("load rules: %w", err)
	}
	return rules, nil
}
