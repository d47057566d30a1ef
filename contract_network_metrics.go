package main

import (
	"encoding/hex"
	"math"
	"time"
)

// The network-metrics topic: the analysis of one capture file, key =
// package_name (docs/design.md "network-metrics", docs/schema.md
// "network_metrics").
const topicNetworkMetrics = "network-metrics"

// networkMetricsMessage is the analysis of one capture file. Field meanings:
// docs/pcap-metrics.md §1.
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

func (m *networkMetricsMessage) validate(now time.Time) *invalidRecord {
	c := checks{now: now}
	_, ok := parseUUID(m.AnalysisID)
	switch {
	case m.AnalysisID == "":
		c.fail(reasonMissing, "analysis_id is required")
	case !ok:
		c.fail(reasonBadValue, "analysis_id %q is not a UUID (8-4-4-4-12 hex digits)", truncateForReason(m.AnalysisID))
	}
	c.packageName(m.PackageName)
	switch m.Scenario {
	case "UPLOAD", "DOWNLOAD":
	case "":
		c.fail(reasonMissing, "scenario is required")
	default:
		c.fail(reasonBadValue, "scenario %q is neither UPLOAD nor DOWNLOAD", truncateForReason(m.Scenario))
	}
	c.timestamp("analyzed_at", &m.AnalyzedAt, true)
	c.number("rtt_handshake", m.RTTHandshake, 0, math.MaxFloat64, false)
	c.count("retransmission_count", m.RetransmissionCount, math.MaxInt32)
	c.count("out_of_order_count", m.OutOfOrderCount, math.MaxInt32)
	c.count("spurious_retransmission_count", m.SpuriousRetransmissionCount, math.MaxInt32)
	c.count("zero_window_count", m.ZeroWindowCount, math.MaxInt32)
	c.count("tcp_reset_count", m.TCPResetCount, math.MaxInt32)
	c.count("bytes_transferred_total", m.BytesTransferredTotal, math.MaxInt64)
	c.count("bytes_payload_total", m.BytesPayloadTotal, math.MaxInt64)
	c.number("overhead_ratio", m.OverheadRatio, 0, 1, true)
	c.text("source_pcap_filename", &m.SourcePcapFilename, maxVarchar255)
	return c.result()
}

func (m *networkMetricsMessage) packageName() string   { return m.PackageName }
func (m *networkMetricsMessage) newestTime() time.Time { return m.AnalyzedAt }

// parseUUID accepts the canonical 8-4-4-4-12 form, any case.
func parseUUID(s string) ([16]byte, bool) {
	var id [16]byte
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return id, false
	}
	h := s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36]
	if _, err := hex.Decode(id[:], []byte(h)); err != nil {
		return id, false
	}
	return id, true
}

// networkMetricsContract appends one row per analysis; analysis_id is the
// idempotency key, so a redelivered message adds nothing.
var networkMetricsContract = newTableContract(tableContract[networkMetricsMessage, *networkMetricsMessage]{
	topic: topicNetworkMetrics,
	table: "network_metrics",
	columns: []column[networkMetricsMessage]{
		{"analysis_id", "uuid", func(m *networkMetricsMessage) any {
			id, _ := parseUUID(m.AnalysisID) // validated
			return id
		}},
		{"scenario", "text", func(m *networkMetricsMessage) any { return m.Scenario }},
		{"rtt_handshake", "double precision", func(m *networkMetricsMessage) any { return m.RTTHandshake }},
		{"retransmission_count", "integer", func(m *networkMetricsMessage) any { return m.RetransmissionCount }},
		{"out_of_order_count", "integer", func(m *networkMetricsMessage) any { return m.OutOfOrderCount }},
		{"spurious_retransmission_count", "integer", func(m *networkMetricsMessage) any { return m.SpuriousRetransmissionCount }},
		{"zero_window_count", "integer", func(m *networkMetricsMessage) any { return m.ZeroWindowCount }},
		{"tcp_reset_count", "integer", func(m *networkMetricsMessage) any { return m.TCPResetCount }},
		{"bytes_transferred_total", "bigint", func(m *networkMetricsMessage) any { return m.BytesTransferredTotal }},
		{"bytes_payload_total", "bigint", func(m *networkMetricsMessage) any { return m.BytesPayloadTotal }},
		{"overhead_ratio", "double precision", func(m *networkMetricsMessage) any { return m.OverheadRatio }},
		// An empty file name is stored as NULL.
		{"source_pcap_filename", "text", func(m *networkMetricsMessage) any {
			if m.SourcePcapFilename == "" {
				return nil
			}
			return m.SourcePcapFilename
		}},
		{"analyzed_at", "timestamptz", func(m *networkMetricsMessage) any { return m.AnalyzedAt }},
	},
	conflict: "ON CONFLICT (analysis_id) DO NOTHING",
})
