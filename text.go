package main

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// validateText checks an optional text field against its column.
func validateText(field string, v *string, maxChars int) error {
	if v == nil {
		return nil
	}
	switch {
	case !utf8.ValidString(*v):
		return fmt.Errorf("%s is not valid UTF-8", field)
	case strings.ContainsRune(*v, 0):
		return fmt.Errorf("%s contains a NUL character", field)
	case utf8.RuneCountInString(*v) > maxChars:
		return fmt.Errorf("%s is longer than %d characters", field, maxChars)
	}
	return nil
}

// truncateForReason keeps a quoted bad value short in a dead letter's reason.
func truncateForReason(s string) string { return truncate(s, 64) }

// truncate cuts s to at most maxBytes at a character boundary, marked
// with "…" when it cut.
func truncate(s string, maxBytes int) string {
	if len(s) <= maxBytes {
		return s
	}
	return cutBytes(s, maxBytes) + "…"
}

// cutBytes cuts s to at most n bytes without splitting a UTF-8 sequence.
func cutBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func cleanTextPtr(s *string) *string {
	if s == nil {
		return nil
	}
	c := cleanText(*s)
	return &c
}

// cleanText drops C0 and C1 control characters except \n, \r and \t (U+0000
// is rejected by PostgreSQL text and jsonb; the rest is noise) and replaces
// invalid UTF-8 with U+FFFD.
func cleanText(s string) string {
	if !needsCleaning(s) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if isStrippedControl(r) {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}

func needsCleaning(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || isStrippedControl(r) {
			return true
		}
	}
	return false
}

func isStrippedControl(r rune) bool {
	if r == '\n' || r == '\r' || r == '\t' {
		return false
	}
	return r < 0x20 || (r >= 0x7f && r <= 0x9f)
}

// jsonTextError is text in a JSON document that is not Unicode: invalid
// UTF-8, or a \u escape of half a UTF-16 surrogate pair.
type jsonTextError struct {
	offset int
	what   string
}

func (e *jsonTextError) Error() string {
	return fmt.Sprintf("the body holds %s at byte %d: send UTF-8 text", e.what, e.offset)
}

// checkJSONText finds what encoding/json would silently turn into U+FFFD.
// A backslash occurs only inside strings in valid JSON, so a byte scan
// finds every escape; anything else malformed is left to the decoder.
func checkJSONText(b []byte) error {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return &jsonTextError{i, "invalid UTF-8"}
		}
		if r != '\\' {
			i += size
			continue
		}
		hi, ok := unicodeEscape(b[i:])
		if !ok {
			i += 2 // \" \\ and the other one-letter escapes
			continue
		}
		if !utf16.IsSurrogate(hi) {
			i += 6
			continue
		}
		if lo, ok := unicodeEscape(b[i+6:]); ok && hi < 0xdc00 && lo >= 0xdc00 && lo <= 0xdfff {
			i += 12
			continue
		}
		return &jsonTextError{i, fmt.Sprintf("a lone surrogate \\u%04x", hi)}
	}
	return nil
}

// unicodeEscape reads the \uXXXX escape at the start of b.
func unicodeEscape(b []byte) (rune, bool) {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[2:6]), 16, 16)
	return rune(v), err == nil
}

// printable makes s fit on one table line.
func printable(s string, maxBytes int) string {
	return truncate(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s), maxBytes)
}
