package main

import (
	"bytes"
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
	reasonPanic        reasonCode = "validation_panic"     // checking the record panicked: a bug, kept for replay once fixed
)

var allReasonCodes = []reasonCode{
	reasonTombstone, reasonEmpty, reasonTooLarge, reasonInvalidUTF8, reasonInvalidJSON,
	reasonWrongType, reasonBadTimestamp, reasonMissing, reasonOutOfRange, reasonTooLong,
	reasonNUL, reasonBadValue, reasonUnregistered, reasonUnknownTopic, reasonSQLError, reasonPanic,
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
	case reflect.Slice:
		return "an array"
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
	case t == nil || t.IsZero() && required:
		// An optional zero time is given, and out of range below.
		if required {
			c.fail(reasonMissing, "%s is required", field)
		}
	case t.Before(validTimeFloor):
		c.fail(reasonOutOfRange, "%s %s is before %s", field, t.Format(time.RFC3339), validTimeFloor.Format(time.DateOnly))
	case t.After(c.now.Add(validTimeSkew)):
		c.fail(reasonOutOfRange, "%s %s is more than %s in the future (a wrong clock at the producer?)", field, t.Format(time.RFC3339), validTimeSkew)
	}
}
