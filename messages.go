package main

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// Topic names of the message contracts in docs/design.md.
const (
	topicAppStats       = "app-stats"
	topicReviews        = "reviews"
	topicNetworkMetrics = "network-metrics"
)

// allTopics lists every topic playwatch creates and consumes.
var allTopics = []string{topicAppStats, topicReviews, topicNetworkMetrics}

// appStatsMessage is one crawl of one app's store listing (topic app-stats,
// key = package_name). Pointers are the nullable metrics: a metric the store
// did not show is null, never a zero that looks like data.
type appStatsMessage struct {
	PackageName  string     `json:"package_name"`
	Title        *string    `json:"title"`
	Genre        *string    `json:"genre"`
	MinInstalls  *int64     `json:"min_installs"`
	Score        *float64   `json:"score"`
	Ratings      *int64     `json:"ratings"`
	ReviewsCount *int64     `json:"reviews_count"`
	Version      *string    `json:"version"`
	AdSupported  *bool      `json:"ad_supported"`
	AppUpdatedAt *time.Time `json:"app_updated_at"`
	CrawledAt    time.Time  `json:"crawled_at"`
}

// reviewMessage is one review as seen by one crawl (topic reviews, key =
// package_name). CrawledAt becomes reviews.last_synced_at.
type reviewMessage struct {
	PackageName   string    `json:"package_name"`
	ReviewID      string    `json:"review_id"`
	UserName      *string   `json:"user_name"`
	ThumbsUpCount int64     `json:"thumbs_up_count"`
	Score         *int      `json:"score"`
	Content       *string   `json:"content"`
	At            time.Time `json:"at"`
	CrawledAt     time.Time `json:"crawled_at"`
}

// encodeJSON returns exactly what json.Marshal(m) returns (the bytes are the
// contract; TestPublishReviewJSONIsEncodingJSON holds them together), several
// times faster: a crawl encodes a thousand reviews per app, and reflection
// took a quarter of the crawler's CPU.
func (m *reviewMessage) encodeJSON() ([]byte, error) {
	// Keys, numbers and times take at most 224 bytes.
	n := 224 + len(m.PackageName) + len(m.ReviewID)
	if m.UserName != nil {
		n += len(*m.UserName)
	}
	if m.Content != nil {
		n += len(*m.Content)
	}
	b := make([]byte, 0, n)
	b = append(b, `{"package_name":`...)
	b = appendJSONString(b, &m.PackageName)
	b = append(b, `,"review_id":`...)
	b = appendJSONString(b, &m.ReviewID)
	b = append(b, `,"user_name":`...)
	b = appendJSONString(b, m.UserName)
	b = append(b, `,"thumbs_up_count":`...)
	b = strconv.AppendInt(b, m.ThumbsUpCount, 10)
	b = append(b, `,"score":`...)
	if m.Score == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, int64(*m.Score), 10)
	}
	b = append(b, `,"content":`...)
	b = appendJSONString(b, m.Content)
	b = append(b, `,"at":`...)
	b, err := appendJSONTime(b, m.At)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"crawled_at":`...)
	if b, err = appendJSONTime(b, m.CrawledAt); err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// appendJSONString appends *s as encoding/json writes it, null for nil. A
// string with nothing to escape is copied; any other goes through
// json.Marshal, so that every escape is encoding/json's own.
func appendJSONString(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	for _, r := range *s {
		if r < ' ' || r == '"' || r == '\\' || r == '<' || r == '>' || r == '&' ||
			r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
			q, _ := json.Marshal(*s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, *s...)
	return append(b, '"')
}

// appendJSONTime appends t as time.Time's MarshalJSON writes it, failing
// where it fails (a year outside 0-9999).
func appendJSONTime(b []byte, t time.Time) ([]byte, error) {
	b = append(b, '"')
	b, err := t.AppendText(b)
	if err != nil {
		return nil, err
	}
	return append(b, '"'), nil
}

// networkMetricsMessage is the analysis of one capture file (topic
// network-metrics, key = package_name). Field meanings: docs/pcap-metrics.md §1.
type networkMetricsMessage struct {
	AnalysisID                  string    `json:"analysis_id"`
	PackageName                 string    `json:"package_name"`
	Scenario                    string    `json:"scenario"`
	RTTHandshake                *float64  `json:"rtt_handshake"`
	RetransmissionCount         int64     `json:"retransmission_count"`
	OutOfOrderCount             int64     `json:"out_of_order_count"`
	SpuriousRetransmissionCount int64     `json:"spurious_retransmission_count"`
	ZeroWindowCount             int64     `json:"zero_window_count"`
	TCPResetCount               int64     `json:"tcp_reset_count"`
	BytesTransferredTotal       int64     `json:"bytes_transferred_total"`
	BytesPayloadTotal           int64     `json:"bytes_payload_total"`
	OverheadRatio               *float64  `json:"overhead_ratio"`
	SourcePcapFilename          string    `json:"source_pcap_filename"`
	AnalyzedAt                  time.Time `json:"analyzed_at"`
}
