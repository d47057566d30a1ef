package main

import "unicode"

// A stand-in for the classifier (sentiment.go), with its API, until the two
// branches meet: the label from the stars alone.

// sentimentResult is one classification.
type sentimentResult struct {
	Label     string // "POSITIVE", "NEUTRAL" or "NEGATIVE"
	Lang      string // "fa", "en" or "other"
	PPositive float64
	PNeutral  float64
	PNegative float64
}

type sentimentModel struct{}

// loadSentimentModel decodes the model embedded with go:embed.
func loadSentimentModel() (*sentimentModel, error) { return &sentimentModel{}, nil }

// Version names the model; at most 40 bytes.
func (m *sentimentModel) Version() string { return "standin-1" }

// Classify labels one review; stars is 1..5, or 0 for none.
func (m *sentimentModel) Classify(text string, stars int) sentimentResult {
	r := sentimentResult{Lang: "other"}
	for _, c := range text {
		if unicode.Is(unicode.Arabic, c) {
			r.Lang = "fa"
			break
		}
		if unicode.Is(unicode.Latin, c) {
			r.Lang = "en"
		}
	}
	switch {
	case stars == 1 || stars == 2:
		r.Label, r.PNegative = "NEGATIVE", 1
	case stars == 4 || stars == 5:
		r.Label, r.PPositive = "POSITIVE", 1
	default:
		r.Label, r.PNeutral = "NEUTRAL", 1
	}
	return r
}
