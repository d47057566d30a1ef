package main

import (
	"encoding/json"
	"fmt"
	"time"
)

// The crawl-jobs topic: one message per app, storefront and cycle, key =
// crawlJobKey (package and storefront), published by the scheduler leader
// and consumed by the crawl workers of every instance in one group
// (docs/design.md "crawl-jobs"). It is not a storage topic: the storage
// consumer never reads it.
const topicCrawlJobs = "crawl-jobs"

// createdTopics are the topics playwatch creates: the storage topics and
// crawl-jobs.
var createdTopics = append(append([]string(nil), allTopics...), topicCrawlJobs)

// maxCrawlJobBytes bounds a job's value: a job is a few hundred bytes.
const maxCrawlJobBytes = 4096

// crawlJobKey is the Kafka key of a's job in the storefront loc,
// "package|country|lang": an app's storefronts hash to different partitions,
// so their jobs spread over the workers. The worker reads the job from its
// value alone, so a job of an older playwatch, keyed by the package, is
// crawled the same; the key also seeds the storefront's full-resync phase
// (fullResyncDue).
func crawlJobKey(pkg string, loc locale) string {
	return pkg + "|" + loc.Country + "|" + loc.Lang
}

// crawlJobMessage is one app's crawl in one storefront and cycle, as it
// travels. PlannedAt
// is the cycle's planned time (a new-app job: the time it was published)
// and becomes the crawled_at of every message of the crawl, so a job
// redelivered to another instance stores nothing twice.
type crawlJobMessage struct {
	CycleID      int64     `json:"cycle_id"` // 0: the new-app watch, not a cycle
	PlannedAt    time.Time `json:"planned_at"`
	PackageName  string    `json:"package_name"`
	IsIranianApp bool      `json:"is_iranian_app"`
	Lang         string    `json:"lang"`
	Country      string    `json:"country"`
	FullResync   bool      `json:"full_resync"`
	// LeaseEpoch is the scheduler lease epoch the job was planned under: its
	// cycle's leader_epoch, or that of the leader publishing a new-app job.
	// 0 (absent): a job of an older playwatch, accepted as it is.
	LeaseEpoch int64 `json:"lease_epoch,omitempty"`
}

// decodeCrawlJob reads and validates a job; a job that breaks the contract
// is skipped by the worker (logged, counted, its offset committed), since
// crawling a wrong package or at a wrong time can only do harm.
func decodeCrawlJob(v []byte, now time.Time) (crawlJobMessage, *invalidRecord) {
	var m crawlJobMessage
	if bad := checkEnvelope(v, maxCrawlJobBytes); bad != nil {
		return m, bad
	}
	if bad := decodeStrict(v, &m); bad != nil {
		return m, bad
	}
	c := checks{now: now}
	if m.CycleID < 0 {
		c.fail(reasonOutOfRange, "cycle_id is %d, below 0", m.CycleID)
	}
	if m.LeaseEpoch < 0 {
		c.fail(reasonOutOfRange, "lease_epoch is %d, below 0", m.LeaseEpoch)
	}
	c.timestamp("planned_at", &m.PlannedAt, true)
	c.packageName(m.PackageName)
	for _, f := range []struct{ name, v string }{{"lang", m.Lang}, {"country", m.Country}} {
		if f.v == "" {
			c.fail(reasonMissing, "%s is required", f.name)
		} else if err := parseLocaleCode(f.v); err != nil {
			c.fail(reasonBadValue, "%s %q: %v", f.name, truncateForReason(f.v), err)
		}
	}
	return m, c.result()
}

func (m crawlJobMessage) encode() ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s message for %s: %w", topicCrawlJobs, m.PackageName, err)
	}
	return b, nil
}

// crawlJob is the crawl the message describes, in the message's locale:
// the leader chose it, so which worker crawls does not change the storefront.
func (m crawlJobMessage) crawlJob() crawlJob {
	return crawlJob{App: app{PackageName: m.PackageName, IsIranianApp: m.IsIranianApp, IsActive: true},
		CrawledAt: messageTime(m.PlannedAt), FullResync: m.FullResync, Locale: locale{Lang: m.Lang, Country: m.Country}}
}
