package main

import "time"

// Topic names of the message contracts in DESIGN.md.
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

// networkMetricsMessage is the analysis of one capture file (topic
// network-metrics, key = package_name). Field meanings: shared/pcap/METRICS.md.
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
