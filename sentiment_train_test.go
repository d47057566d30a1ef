package main

import (
	"math"
	"os"
	"sort"
	"testing"
)

// TestTrainSentiment is the trainer (make train-sentiment, docs/sentiment.md
// §3.1). It lives in a test file so that it shares the feature code with
// the product without shipping in the binary. It rewrites
// sentiment_model.bin.gz; the same inputs give the same bytes.
func TestTrainSentiment(t *testing.T) {
	if os.Getenv("PLAYWATCH_TRAIN_SENTIMENT") != "1" {
		t.Skip("the trainer runs with make train-sentiment (PLAYWATCH_TRAIN_SENTIMENT=1)")
	}
	lex := vaderLexicon(t)
	m, err := newSentimentModel(nil, [sentClasses]float32{}, lex)
	if err != nil {
		t.Fatal(err)
	}
	data := sentimentTrainingSet(t, m, "")
	w, bias := trainSentiment(data, nil, trainEpochs)
	file := encodeSentimentModel(w, bias, lex)
	if err := os.WriteFile("sentiment_model.bin.gz", file, 0o644); err != nil {
		t.Fatal(err)
	}
	var counts [sentClasses]int
	for _, ex := range data {
		counts[ex.class]++
	}
	t.Logf("trained on %d texts (negative %d, neutral %d, positive %d); model file %d bytes", len(data), counts[0], counts[1], counts[2], len(file))
}

// sentimentTrainingSet is everything the model learns from: the UCI
// sentences and the recorded Play Store reviews outside their held-out
// fifth, and our own training sentences (disjoint from the dev sets);
// without the source named exclude, for the cross-domain table of the
// evaluation (sentimentTrainingSources).
func sentimentTrainingSet(t *testing.T, m *sentimentModel, exclude string) []trainExample {
	var items []struct {
		sentItem
		lang   string
		weight float64
	}
	add := func(set []sentItem, lang string, weight float64, heldOutSplit bool) {
		for _, it := range set {
			if heldOutSplit && sentHeldOut(it.Text) {
				continue
			}
			l := lang
			if l == "" {
				if l = detectSentimentLang(it.Text); l == "other" {
					continue
				}
			}
			items = append(items, struct {
				sentItem
				lang   string
				weight float64
			}{it, l, weight})
		}
	}
	for _, src := range sentimentTrainingSources(t) {
		if src.name != exclude {
			add(src.items, src.lang, src.weight, src.heldOutSplit)
		}
	}

	var perClass [sentClasses]float64
	for _, it := range items {
		perClass[it.Class] += it.weight
	}
	total := perClass[0] + perClass[1] + perClass[2]
	out := make([]trainExample, 0, len(items))
	for _, it := range items {
		balance := math.Min(total/(sentClasses*perClass[it.Class]), 3)
		out = append(out, trainExample{feats: m.features(it.Text, it.lang), class: it.Class, weight: it.weight * balance})
	}
	return out
}

// trainSource is one data set the trainer learns from.
type trainSource struct {
	name         string
	lang         string // "" decides per text
	items        []sentItem
	weight       float64
	heldOutSplit bool // a fifth by hash is kept out for the evaluation
}

func sentimentTrainingSources(t *testing.T) []trainSource {
	uci := uciSentences(t)
	names := make([]string, 0, len(uci))
	for name := range uci {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []trainSource
	for _, name := range names {
		out = append(out, trainSource{name, "en", uci[name], 1, true})
	}
	return append(out,
		trainSource{"playstore", "", playstoreSentimentItems(t), 1, true},
		trainSource{"train_en", "", readSentimentTSV(t, "train_en.tsv"), 1.5, false},
		trainSource{"train_fa", "fa", readSentimentTSV(t, "train_fa.tsv"), 2, false},
	)
}
