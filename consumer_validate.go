package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// reasonCode says why a record is a dead letter. The set is closed: it labels
// the dead-letter metric and starts every dead_letter_events.error_reason, so
// `dlq list --reason` and dashboards can group by it.
type reasonCode string

const (
	reasonTombstone    reasonCode = "tombstone"            // null value
	reasonEmpty        reasonCode = "empty_value"          // zero-length value
	reasonTooLarge     reasonCode = "too_large"            // over CONSUMER_MAX_RECORD_BYTES
	reasonInvalidUTF8  reasonCode = "invalid_utf8"         // value is not UTF-8
	reasonInvalidJSON  reasonCode = "invalid_json"         // not one JSON object
	reasonWrongType    reasonCode = "wrong_type"           // a field has the wrong JSON type
	reasonBadTimestamp reasonCode = "bad_timestamp"        // not RFC 3339 with a zone
	reasonMissing      reasonCode = "missing_field"        // a required field is absent or null
	reasonOutOfRange   reasonCode = "out_of_range"         // a number or time outside its range
	reasonTooLong      reasonCode = "too_long"             // text longer than its column
	reasonNUL          reasonCode = "nul_character"        // text with U+0000, which PostgreSQL rejects
	reasonBadValue     reasonCode = "invalid_value"        // bad UUID, scenario or package name
	reasonUnregistered reasonCode = "unregistered_package" // package_name not in the registry
	reasonUnknownTopic reasonCode = "unknown_topic"        // a topic without a contract
	reasonSQLError     reasonCode = "sql_error"            // PostgreSQL refused the row itself
)

var allReasonCodes = []reasonCode{
	reasonTombstone, reasonEmpty, reasonTooLarge, reasonInvalidUTF8, reasonInvalidJSON,
	reasonWrongType, reasonBadTimestamp, reasonMissing, reasonOutOfRange, reasonTooLong,
	reasonNUL, reasonBadValue, reasonUnregistered, reasonUnknownTopic, reasonSQLError,
}

// deadLetter is a record that can never be stored, and why.
type deadLetter struct {
	src    *kgo.Record
	code   reasonCode
	reason string // "code: what is wrong and what to do"
}

func newDeadLetter(src *kgo.Record, code reasonCode, detail string) deadLetter {
	return deadLetter{src: src, code: code, reason: string(code) + ": " + detail}
}

// Rows of the three data tables, each with the record it came from (for its
// Kafka position and for dead-lettering it if PostgreSQL refuses it).
type (
	statRow struct {
		src   *kgo.Record
		appID int64
		msg   appStatsMessage
	}
	reviewRow struct {
		src   *kgo.Record
		appID int64
		msg   reviewMessage
	}
	networkRow struct {
		src        *kgo.Record
		appID      int64
		analysisID [16]byte
		msg        networkMetricsMessage
	}
)

// batchRows is a batch of records sorted into what goes to which table.
type batchRows struct {
	stats   []statRow
	reviews []reviewRow
	metrics []networkRow
	dead    []deadLetter
}

// Column limits of schema.sql that the validation enforces, so that a value
// PostgreSQL would refuse is a dead letter instead of a failing batch.
const (
	maxVarchar255 = 255
	maxCategory   = 100
	maxVersion    = 50
)

// Timestamps outside [validTimeFloor, now+validTimeSkew] are dead letters: a
// clock far in the future would otherwise win every later review upsert.
var validTimeFloor = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

const validTimeSkew = time.Hour

// decodeRecords validates each record against its topic's contract.
func decodeRecords(recs []*kgo.Record, maxBytes int, now time.Time) *batchRows {
	b := &batchRows{}
	for _, r := range recs {
		b.add(r, maxBytes, now)
	}
	return b
}

// add validates one record and appends it to its table, or to the dead letters.
func (b *batchRows) add(r *kgo.Record, maxBytes int, now time.Time) {
	if bad := checkEnvelope(r.Value, maxBytes); bad != nil {
		b.dead = append(b.dead, newDeadLetter(r, bad.code, bad.detail))
		return
	}
	var bad *invalidRecord
	switch r.Topic {
	case topicAppStats:
		row := statRow{src: r}
		if bad = decodeStrict(r.Value, &row.msg); bad == nil {
			bad = validateAppStats(&row.msg, now)
		}
		if bad == nil {
			b.stats = append(b.stats, row)
		}
	case topicReviews:
		row := reviewRow{src: r}
		if bad = decodeStrict(r.Value, &row.msg); bad == nil {
			bad = validateReview(&row.msg, now)
		}
		if bad == nil {
			b.reviews = append(b.reviews, row)
		}
	case topicNetworkMetrics:
		row := networkRow{src: r}
		if bad = decodeStrict(r.Value, &row.msg); bad == nil {
			row.analysisID, bad = validateNetworkMetrics(&row.msg, now)
		}
		if bad == nil {
			b.metrics = append(b.metrics, row)
		}
	default:
		bad = &invalidRecord{reasonUnknownTopic, fmt.Sprintf("topic %q has no message contract", r.Topic)}
	}
	if bad != nil {
		b.dead = append(b.dead, newDeadLetter(r, bad.code, bad.detail))
	}
}

// invalidRecord is the first thing found wrong with a record; detail may
// list further problems.
type invalidRecord struct {
	code   reasonCode
	detail string
}

func checkEnvelope(v []byte, maxBytes int) *invalidRecord {
	switch {
	case v == nil:
		return &invalidRecord{reasonTombstone, "the value is null (a tombstone); every message must carry a JSON object"}
	case len(v) == 0:
		return &invalidRecord{reasonEmpty, "the value is empty; every message must carry a JSON object"}
	case len(v) > maxBytes:
		return &invalidRecord{reasonTooLarge, fmt.Sprintf("the value has %d bytes, more than CONSUMER_MAX_RECORD_BYTES=%d", len(v), maxBytes)}
	case !utf8.Valid(v):
		return &invalidRecord{reasonInvalidUTF8, "the value is not valid UTF-8"}
	}
	if t := bytes.TrimLeft(v, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return &invalidRecord{reasonInvalidJSON, "the value is not a JSON object"}
	}
	return nil
}

// decodeStrict decodes a JSON object into a message type. Unknown fields are
// allowed (producers may be newer), a field of the wrong JSON type is not.
func decodeStrict(v []byte, into any) *invalidRecord {
	err := json.Unmarshal(v, into)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var tp *time.ParseError
	switch {
	case errors.As(err, &syn):
		return &invalidRecord{reasonInvalidJSON, fmt.Sprintf("not valid JSON at byte %d: %v", syn.Offset, syn)}
	case errors.As(err, &typ):
		return &invalidRecord{reasonWrongType, fmt.Sprintf("field %s is a JSON %s, the contract wants %s", typ.Field, truncateForReason(typ.Value), jsonTypeName(typ.Type))}
	case errors.As(err, &tp):
		return &invalidRecord{reasonBadTimestamp, fmt.Sprintf("%q is not an RFC 3339 timestamp with a zone, e.g. 2026-01-02T15:04:05Z", truncateForReason(tp.Value))}
	default:
		// time.Time's own decoder, given a number or a bool.
		return &invalidRecord{reasonWrongType, fmt.Sprintf("a timestamp field is not a JSON string: %v", err)}
	}
}

func jsonTypeName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	}
	return t.String()
}

// checks collects what is wrong with the fields of one message; the first
// problem gives the reason code.
type checks struct {
	now     time.Time
	code    reasonCode
	details []string
}

func (c *checks) fail(code reasonCode, format string, args ...any) {
	if c.code == "" {
		c.code = code
	}
	c.details = append(c.details, fmt.Sprintf(format, args...))
}

func (c *checks) result() *invalidRecord {
	if c.code == "" {
		return nil
	}
	return &invalidRecord{c.code, strings.Join(c.details, "; ")}
}

func (c *checks) requiredText(field, v string, maxChars int) {
	if v == "" {
		c.fail(reasonMissing, "%s is required", field)
		return
	}
	c.text(field, &v, maxChars)
}

// text checks an optional text against a VARCHAR(maxChars) column (0: TEXT).
func (c *checks) text(field string, v *string, maxChars int) {
	switch {
	case v == nil:
	case strings.IndexByte(*v, 0) >= 0:
		c.fail(reasonNUL, "%s contains a NUL character (\\u0000), which PostgreSQL text cannot hold", field)
	case maxChars > 0 && len(*v) > maxChars && utf8.RuneCountInString(*v) > maxChars:
		c.fail(reasonTooLong, "%s has %d characters, its column holds %d", field, utf8.RuneCountInString(*v), maxChars)
	}
}

func (c *checks) packageName(v string) {
	if v == "" {
		c.fail(reasonMissing, "package_name is required")
		return
	}
	if err := validatePackageName(v); err != nil {
		c.fail(reasonBadValue, "%v", err)
	}
}

// count checks a non-negative integer; maxValue is its column's limit.
func (c *checks) count(field string, v, maxValue int64) {
	switch {
	case v < 0:
		c.fail(reasonOutOfRange, "%s is %d, a count cannot be negative", field, v)
	case v > maxValue:
		c.fail(reasonOutOfRange, "%s is %d, its column holds at most %d", field, v, maxValue)
	}
}

func (c *checks) optCount(field string, v *int64) {
	if v != nil {
		c.count(field, *v, math.MaxInt64)
	}
}

func (c *checks) number(field string, v *float64, lo, hi float64, required bool) {
	switch {
	case v == nil && required:
		c.fail(reasonMissing, "%s is required (its column is NOT NULL)", field)
	case v == nil:
	case *v < lo || *v > hi:
		c.fail(reasonOutOfRange, "%s is %v, outside [%v, %v]", field, *v, lo, hi)
	}
}

func (c *checks) timestamp(field string, t *time.Time, required bool) {
	switch {
	case t == nil || t.IsZero():
		if required {
			c.fail(reasonMissing, "%s is required", field)
		}
	case t.Before(validTimeFloor):
		c.fail(reasonOutOfRange, "%s %s is before %s", field, t.Format(time.RFC3339), validTimeFloor.Format(time.DateOnly))
	case t.After(c.now.Add(validTimeSkew)):
		c.fail(reasonOutOfRange, "%s %s is more than %s in the future (a wrong clock at the producer?)", field, t.Format(time.RFC3339), validTimeSkew)
	}
}

func validateAppStats(m *appStatsMessage, now time.Time) *invalidRecord {
	c := checks{now: now}
	c.packageName(m.PackageName)
	c.timestamp("crawled_at", &m.CrawledAt, true)
	c.text("title", m.Title, maxVarchar255)
	c.text("genre", m.Genre, maxCategory)
	c.text("version", m.Version, maxVersion)
	c.optCount("min_installs", m.MinInstalls)
	c.optCount("ratings", m.Ratings)
	c.optCount("reviews_count", m.ReviewsCount)
	c.number("score", m.Score, 0, 5, false)
	if m.AppUpdatedAt != nil {
		c.timestamp("app_updated_at", m.AppUpdatedAt, false)
	}
	return c.result()
}

func validateReview(m *reviewMessage, now time.Time) *invalidRecord {
	c := checks{now: now}
	c.packageName(m.PackageName)
	c.requiredText("review_id", m.ReviewID, maxVarchar255)
	c.timestamp("at", &m.At, true)
	c.timestamp("crawled_at", &m.CrawledAt, true)
	c.text("user_name", m.UserName, maxVarchar255)
	c.text("content", m.Content, 0)
	c.count("thumbs_up_count", m.ThumbsUpCount, math.MaxInt32)
	if m.Score != nil && (*m.Score < 1 || *m.Score > 5) {
		c.fail(reasonOutOfRange, "score is %d, a review's score is 1 to 5", *m.Score)
	}
	return c.result()
}

func validateNetworkMetrics(m *networkMetricsMessage, now time.Time) ([16]byte, *invalidRecord) {
	c := checks{now: now}
	id, ok := parseUUID(m.AnalysisID)
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
	return id, c.result()
}

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
