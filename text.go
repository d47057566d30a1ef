package main

import (
	"fmt"
	"strings"
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

// truncate cuts s to at most maxBytes at a character boundary.
func truncate(s string, maxBytes int) string {
	if len(s) <= maxBytes {
		return s
	}
	cut := maxBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
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
